"""The host's matmul kernel (runtime/host_matmul.c) by its build options and threads, beside torch.bmm (issue 21).

    PYTHONPATH=. python bench/probe_host_kernel.py > $OUT/host-kernel.jsonl      # the H200's host (about a minute)
    python bench/probe_host_kernel.py --small                                    # tiny shapes (the tests)

On the backend's host thread (``HostWorker``'s thread count), 64 Qwen3-MoE experts' gate/up [E, 2I, H] and down
[E, H, I] projections at 1, 2 and 4 rows an expert, GB/s of weights (median of 8):

- ``read``: what the host's memory gives one pass over the same bytes (torch's sum over them viewed as float32);
- ``bmm``: torch.bmm (oneDNN), the host's part before the kernel;
- ``kernel``: the kernel built with each of ``VARIANTS`` (``OUTS``: weight rows read at once; ``PREFETCH``: bf16
  values ahead to prefetch from, 0 none), and the default build on fewer threads.
The last line names the variant with the most GB/s summed over the rows and projections (``best``)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import host_matmul  # noqa: E402
from runtime.calibrate_host import HIDDEN, PART, WIDTH, _on_host_thread  # noqa: E402
from runtime.timing import wall_ms  # noqa: E402

VARIANTS = ((), ("OUTS=1",), ("OUTS=2",), ("OUTS=4",), ("OUTS=8",), ("PREFETCH=512",), ("OUTS=4", "PREFETCH=512"),
            ("OUTS=2", "PREFETCH=1024"))
ROWS = (1, 2, 4)


def probe(experts: int, hidden: int, width: int, repeat: int) -> list[dict]:
    projections = {"gate_up": torch.randn(experts, 2 * width, hidden).to(torch.bfloat16),
                   "down": torch.randn(experts, hidden, width).to(torch.bfloat16)}
    ids = torch.arange(experts)
    threads = torch.get_num_threads()
    out: list[dict] = []

    def row(case: str, proj: str, m: int, ms: float, **extra) -> None:
        out.append({"case": case, "proj": proj, "rows": m, "ms": round(ms, 3),
                    "gbps": round(projections[proj].nbytes / ms / 1e6, 1), "threads": torch.get_num_threads(), **extra})

    libs = {}
    for defines in VARIANTS:
        try:
            libs[defines] = host_matmul.build(defines)
        except (OSError, RuntimeError) as exc:
            out.append({"case": "kernel", "defines": list(defines), "error": str(exc)[:300]})
    for proj, w in projections.items():
        row("read", proj, 0, wall_ms(lambda w=w: w.view(torch.float32).sum(), repeat))
        for m in ROWS:
            x = torch.randn(experts, m, w.shape[-1]).to(torch.bfloat16)
            seen = torch.full((experts,), m)
            row("bmm", proj, m, wall_ms(lambda: torch.bmm(x, w.transpose(1, 2)), repeat))
            for defines, lib in libs.items():
                row("kernel", proj, m, wall_ms(lambda lib=lib: host_matmul.grouped_rows(x, w, ids, seen, lib), repeat),
                    defines=list(defines))
            for n in sorted({max(1, threads // 2), max(1, threads * 3 // 4), threads + 1} - {threads}):
                torch.set_num_threads(n)
                try:
                    row("kernel", proj, m, wall_ms(lambda: host_matmul.grouped_rows(x, w, ids, seen, libs[()]),
                                                   repeat), defines=[])
                finally:
                    torch.set_num_threads(threads)
    mine = [r for r in out if r["case"] == "kernel" and "gbps" in r and r["threads"] == threads]
    scores = {tuple(r["defines"]): 0.0 for r in mine}
    for r in mine:
        scores[tuple(r["defines"])] += r["gbps"]
    if scores:
        best = max(scores, key=scores.get)
        out.append({"case": "best", "defines": list(best), "gbps_sum": round(scores[best], 1),
                    "default_gbps_sum": round(scores.get((), 0.0), 1),
                    "bmm_gbps_sum": round(sum(r["gbps"] for r in out if r["case"] == "bmm"), 1)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes (the tests' smoke run)")
    args = ap.parse_args(argv)
    shape = (4, 64, 32) if args.small else (PART, HIDDEN, WIDTH)
    run = lambda: probe(*shape, repeat=1 if args.small else 8)  # noqa: E731
    rows = _on_host_thread(run) if torch.cuda.is_available() else run()
    for r in rows:
        print(json.dumps(r), flush=True)
    return 0 if any(r["case"] == "best" for r in rows) or host_matmul.library() is None else 1


if __name__ == "__main__":
    sys.exit(main())
