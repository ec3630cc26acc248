"""Wall-clock timing of a callable: the median of timed runs after warm-up runs.

One loop for the runtime's calibrations (runtime/calibrate/, runtime/calibrate_host.py) and the benches.
``sync``: called after the warm-ups and after each timed run (``torch.cuda.synchronize`` where GPU work must
be waited for); ``hold_gc``: the garbage collector collected once, then held off while timing.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable


def wall_ms(fn: Callable[[], object], repeat: int, warmup: int = 1, sync: Callable[[], object] | None = None,
            hold_gc: bool = False) -> float:
    """The median wall time of ``repeat`` runs of ``fn`` after ``warmup`` runs, in milliseconds."""
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    times = []
    if hold_gc:
        gc.collect()
        gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        if hold_gc:
            gc.enable()
    return statistics.median(times)
