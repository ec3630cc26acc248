"""Run a bench script under a watchdog that reports every few seconds what the host flags of the cpu backend hold.

    PYTHONPATH=. python bench/watch_run.py SECONDS bench/bench_memory.py ARGS...

Every SECONDS: each ``runtime.stream_wait.HostFlag``'s count waited for and value raised, and every thread's
innermost frames (a run that stalls says where and why). The watchdog makes no CUDA call: one that blocks on the
driver while this thread holds the GIL would stall the run itself (a first version queried the stream and did).
"""
import gc
import runpy
import sys
import threading
import time
import traceback
import warnings


def watch(every: float) -> None:
    from runtime.stream_wait import HostFlag

    while True:
        time.sleep(every)
        with warnings.catch_warnings():  # looking at every object wakes some libraries' deprecation warnings
            warnings.simplefilter("ignore")
            flags = [o for o in gc.get_objects() if isinstance(o, HostFlag)]
        behind = [(f._count, f._cell.value) for f in flags if f._count != f._cell.value]
        lines = [f"[watch {time.strftime('%H:%M:%S')}] flags {len(flags)} behind (waited, raised) {behind[:6]}"]
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == threading.get_ident():
                continue
            where = traceback.format_stack(frame, limit=3)
            lines.append(f"  {names.get(ident, ident)}: " + " | ".join(w.strip().splitlines()[0] for w in where))
        print("\n".join(lines), file=sys.stderr, flush=True)


if __name__ == "__main__":
    every = float(sys.argv[1])
    threading.Thread(target=watch, args=(every,), daemon=True).start()
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
