"""Where an eager decode step of split experts spends its time (issue 21).

    PYTHONPATH=. python bench/probe_split_eager.py --out $OUT/split-eager.jsonl     # the H200

``bench_moe_hybrid.py --only skewed`` measured the Qwen3-MoE shape at batch 1 (routers biased so that a fifth
of the experts gets 80% of the choices): the all-UVA plan 70.0 ms eager and 33.3 in graph replay, the plan that
keeps the hot experts on the GPU 77.6 eager and 15.9 in replay (2026-12-02). Eager, the hot plan gains nothing.
Here the same model, routers and plans, and for the resident model and each plan at batch 1: the CPU's issue
time (a forward's wall time until it returns, on an idle GPU), the step (until the GPU is done), the graph
replay, and torch.profiler's CPU-side table of three eager steps (ops by self CPU time, with the calls that
wait for the GPU: synchronizes, copies to the host, ``item``), so that a wait or a costly op shows by name."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_moe_hybrid as h  # noqa: E402

import runtime  # noqa: E402

WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "aten::item",
         "aten::_local_scalar_dense", "cudaMemcpyAsync", "aten::nonzero", "cudaStreamWaitEvent", "cudaLaunchKernel",
         "cudaGraphLaunch", "cuLaunchKernel", "cudaLaunchKernelExC")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def issue_and_step(fn, repeat: int = 15) -> tuple[float, float]:
    issue, step = [], []
    for i in range(repeat + 3):
        sync()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        if i >= 3:
            issue.append((t1 - t0) * 1e3)
            step.append((t2 - t0) * 1e3)
    return statistics.median(issue), statistics.median(step)


def cpu_table(fn, steps: int = 3) -> dict:
    fn()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        sync()
    avg = prof.key_averages()
    top = sorted(avg, key=lambda e: -e.self_cpu_time_total)[:30]
    waits = {e.key: [round(e.count / steps, 1), round(e.self_cpu_time_total / steps, 1)] for e in avg if e.key in WAITS}
    return {"top_self_cpu_us": [[e.key[:80], round(e.count / steps, 1), round(e.self_cpu_time_total / steps, 1)]
                                for e in top], "waits": waits,
            "self_cpu_us_total": round(sum(e.self_cpu_time_total for e in avg) / steps, 1)}


class Probe(h.Bench):
    def measure(self, model_name, label, plan, model, config, cases, shares=None, graph=False, link=None):
        handle = runtime.apply(plan, model, device=str(self.device)) if plan is not None else None
        try:
            ids = self.ids((1, 1), config.vocab_size)
            with torch.inference_mode():
                step = lambda: model(ids, use_cache=False)  # noqa: E731
                issue, total = issue_and_step(step)
                events = self.time_ms(step, 1)
                replay = self.time_ms(h.graph_step(model, ids), 1) if graph and self.device.type == "cuda" else None
                table = cpu_table(step)
            self.emit(model=model_name, plan=label, issue_ms=round(issue, 3), step_ms=round(total, 3),
                      events_ms=round(events, 3), replay_ms=None if replay is None else round(replay, 3), **table)
        finally:
            if handle is not None:
                handle.remove()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    args = ap.parse_args()
    probe = Probe(argparse.Namespace(dry_run=args.dry_run, out=args.out, device="cpu" if args.dry_run else "cuda",
                                     cases=["decode1"]))
    real_skewed_measure = probe.measure

    def first_resident(model_name, label, plan, model, config, cases, **kw):
        if not getattr(probe, "_resident_done", False):
            probe._resident_done = True
            real_skewed_measure(model_name, "resident", None, model, config, cases, graph=True)
        real_skewed_measure(model_name, label, plan, model, config, cases, **kw)

    probe.measure = first_resident
    probe.skewed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
