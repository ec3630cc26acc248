"""One step under torch.profiler: the top ops table (by device time and by self CPU time) and the copies it made."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch


def profile_step(fn: Callable[[], object], device: torch.device, path: Path, rows: int = 25) -> dict:
    """Run ``fn`` once under the profiler; write the tables to ``path``; return a summary for the JSONL."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.no_grad(), profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    by_device = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    text = (f"# sorted by {by_device}\n{events.table(sort_by=by_device, row_limit=rows)}\n"
            f"# sorted by self_cpu_time_total\n{events.table(sort_by='self_cpu_time_total', row_limit=rows)}\n")
    path.write_text(text)

    def device_us(e) -> float:
        return float(getattr(e, "device_time_total", 0.0) or 0.0)

    top = sorted(events, key=lambda e: (device_us(e), e.cpu_time_total), reverse=True)[:10]
    copies = [e for e in events if "memcpy" in e.key.lower() or e.key in ("aten::copy_", "aten::_to_copy",
                                                                            "cudaHostAlloc", "cudaMemcpyAsync")]
    return {"table": str(path),
            "top": [{"op": e.key, "calls": e.count, "cpu_ms": round(e.cpu_time_total / 1e3, 3),
                     "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3), "device_ms": round(device_us(e) / 1e3, 3)}
                    for e in top],
            "copies": [{"op": e.key, "calls": e.count, "cpu_ms": round(e.cpu_time_total / 1e3, 3),
                        "device_ms": round(device_us(e) / 1e3, 3)} for e in copies]}
