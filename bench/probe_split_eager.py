"""Where an eager decode step of split experts spends its time (issue 21).

    PYTHONPATH=. python bench/probe_split_eager.py --out $OUT/split-eager.jsonl     # the H200

``bench_moe_hybrid.py --only skewed`` measured the Qwen3-MoE shape at batch 1 (routers biased so that a fifth
of the experts gets 80% of the choices): the all-UVA plan 70.0 ms eager and 33.3 in graph replay, the plan that
keeps the hot experts on the GPU 77.6 eager and 15.9 in replay (2026-12-02). Eager, the hot plan gains nothing.
Here the same model, routers and plans, and for the resident model and each plan at batch 1: the CPU's issue
time (a forward's wall time until it returns, on an idle GPU), the step (until the GPU is done), the graph
replay, and torch.profiler's CPU-side table of three eager steps (ops by self CPU time, with the calls that
wait for the GPU: synchronizes, copies to the host, ``item``), so that a wait or a costly op shows by name.

``--interleave``: the host's speed moves between minutes (the same all-UVA plan measured 46.5 and 75.4 ms eager
in one call on 2026-12-02), so a ratio of two eager steps means something only when both are timed at the same
moment. Two copies of the model, the all-UVA plan applied to one and the hot-experts plan to the other, timed in
turns: each turn 10 steps back to back (wall clock, the GPU idle before and waited for after: a step as a loop
of forwards sees it), the ratio taken per round and its median reported."""
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
    def measure(self, model_name, label, plan, model, config, cases, shares=None, graph=False, link=None, **apply):
        handle = runtime.apply(plan, model, device=str(self.device), **apply) if plan is not None else None
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

    def in_turn(self, *args, **kwargs) -> None:  # bench_moe_hybrid's side-by-side turns: not this probe's table
        return None


class Interleave(h.Bench):
    """Collects the skewed part's plans instead of measuring them (``interleaved`` measures them)."""

    def measure(self, model_name, label, plan, model, config, cases, shares=None, graph=False, link=None, **apply):
        self.plans = getattr(self, "plans", {})
        self.plans.setdefault(label, plan)

    def in_turn(self, *args, **kwargs) -> None:  # the plans are measured by ``interleaved``
        return None


def loop_ms(fn, steps: int = 10) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) / steps * 1e3


def interleaved(bench: Interleave, rounds: int = 8) -> None:
    """The all-UVA and the hot-experts plans on two copies of the model, timed in turns."""
    models, handles = {}, []
    for label in ("uva", "hot"):
        model, config = bench.build("qwen3_moe")
        h.bias_routers(model, config, bench.ids((128, 1), config.vocab_size, seed=7), bench)
        handles.append(runtime.apply(bench.plans[label], model, device=str(bench.device)))
        if bench.device.type == "cuda":
            torch.cuda.empty_cache()
        models[label] = model
    try:
        _turns(bench, models, bench.ids((1, 1), config.vocab_size), rounds)
    finally:
        for handle in handles:
            handle.remove()


def _turns(bench: Interleave, models: dict, ids, rounds: int) -> None:
    with torch.inference_mode():
        steps = {label: (lambda m=m: m(ids, use_cache=False)) for label, m in models.items()}
        for fn in steps.values():
            loop_ms(fn, 3)
        times = {label: [] for label in steps}
        for _ in range(rounds):
            for label, fn in steps.items():
                times[label].append(loop_ms(fn))
        ratios = [hot / uva for hot, uva in zip(times["hot"], times["uva"])]
        replay = {label: bench.time_ms(h.graph_step(m, ids), 1) if bench.device.type == "cuda" else None
                  for label, m in models.items()}
    bench.emit(kind="interleaved", rounds=rounds, eager_ms={k: [round(x, 2) for x in v] for k, v in times.items()},
               eager_ratio_per_round=[round(r, 3) for r in ratios], eager_ratio_median=round(statistics.median(ratios), 3),
               replay_ms={k: None if v is None else round(v, 3) for k, v in replay.items()},
               replay_ratio=round(replay["hot"] / replay["uva"], 3) if bench.device.type == "cuda" else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--interleave", action="store_true", help="the two plans on two models, timed in turns (GPU)")
    ap.add_argument("--profile", default="h200", help="the hardware profile (as bench_moe_hybrid.py's)")
    args = ap.parse_args()
    if args.interleave:
        bench = Interleave(argparse.Namespace(dry_run=args.dry_run, out=args.out,
                                              device="cpu" if args.dry_run else "cuda", cases=["decode1"],
                                              profile=args.profile))
        bench.skewed()
        interleaved(bench)
        return 0
    probe = Probe(argparse.Namespace(dry_run=args.dry_run, out=args.out, device="cpu" if args.dry_run else "cuda",
                                     cases=["decode1"], profile=args.profile))
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
