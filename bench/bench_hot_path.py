"""The eager hot path's CPU cost, and how close compiled offloaded outputs are to the resident model's.

    PYTHONPATH=. python bench/bench_hot_path.py --out $OUT/hot-path.jsonl
    python bench/bench_hot_path.py --device cpu --smoke --out /tmp/hot.jsonl   # CPU smoke run

Eager decode (batch 1, one token, ``use_cache=False``), for the Llama-3-8B shape at 12 GB and the Qwen3-MoE
shape at 12 GB (``auto``'s plans for eager decode): the median wall time of a forward call started on an idle
GPU until it returns (the CPU's issue time, since nothing in a forward waits for the GPU on the host) and until
the GPU is done (the step), for the resident model, for the plan with the hooks calling the offloader directly
(this version) and with the hooks going through the custom ops as before (``is_compiling`` forced on: the
path the runtime took in eager mode until 2026-12-01, less its stream context manager). Outputs of each
are compared with the resident model's bit for bit. Per layer: the resident forward's CPU time over its
layers, and an offloaded layer's, (offloaded forward - resident forward) / offloaded layers + that.

Then the host time spent inside the hooks' methods (start_copies, wait_copy, join, the write check) per
forward, timed by wrapping them (``HookClock``): what the hooks cost the CPU, whatever the GPU queue does
(an eager forward whose compute stream waits on copies fills the launch queue, and the host then blocks in
a kernel launch: that wait is no issue work). Per offloaded layer: a hook-free layer's time plus the hooks'.

Then (Llama only) ``--exact``: the 8 GB plan's prefill of 64 tokens under ``torch.compile(mode=
"reduce-overhead")`` against the resident model compiled the same way and both against eager: the max
abs difference and the share of positions whose top-1 token agrees.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from bench_cost import build  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
import runtime.prefetch as prefetch_module  # noqa: E402

GB = 10**9


def timed(fn, device, n: int = 30, sync: bool = False) -> float:
    """Median ms of ``fn()`` started on an idle GPU: without ``sync`` until the call returns (the CPU's issue
    time: nothing in an eager forward waits for the GPU on the host), with ``sync`` until the GPU is done."""
    times = []
    for i in range(n + 5):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if sync and device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return statistics.median(times)


def eager_costs(model, ids, device) -> dict:
    with torch.no_grad():
        out = model(ids, use_cache=False).logits.clone()
        cpu = timed(lambda: model(ids, use_cache=False), device)
        step = timed(lambda: model(ids, use_cache=False), device, sync=True)
    return {"cpu_ms": cpu, "step_ms": step, "logits": out}


class HookClock:
    """Host time spent inside the offloader's hot-path methods and the write check, per call, while installed:
    the class methods are wrapped before ``apply`` (the hooks bind them when they are made)."""

    NAMES = ("start_copies", "wait_copy", "join_after_forward")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.saved: list = []

    def __enter__(self) -> "HookClock":
        from runtime.writes import WriteWatch

        for cls, name in [(prefetch_module.PrefetchOffloader, n) for n in self.NAMES] + [(WriteWatch, "check")]:
            real = getattr(cls, name)
            self.saved.append((cls, name, real))

            def timed(*a, _real=real, **k):
                t0 = time.perf_counter()
                try:
                    return _real(*a, **k)
                finally:
                    self.seconds += time.perf_counter() - t0

            setattr(cls, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for cls, name, real in self.saved:
            setattr(cls, name, real)


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {"bit_identical": bool(torch.equal(a, b)), "max_abs_diff": (a.float() - b.float()).abs().max().item(),
            "top1_agree": (a.argmax(-1) == b.argmax(-1)).float().mean().item()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", choices=["llama", "moe"])
    ap.add_argument("--no-exact", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    out = open(args.out, "w")

    def write(row: dict) -> None:
        row = {k: v for k, v in row.items() if k != "logits"}
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps(row), flush=True)

    for kind in ([args.only] if args.only else ["llama", "moe"]):
        model, config = build(kind, args.smoke, device)
        spec = runtime.describe(model, name=kind)
        total = sum(t.nbytes for layer in spec.model.expanded() for t in layer.params)
        ids = torch.randint(0, config.vocab_size, (1, 1), generator=torch.Generator().manual_seed(3)).to(device)
        layers = len(model.model.layers)
        resident = eager_costs(model, ids, device)
        write({"model": kind, "run": "resident", "layers": layers, **resident,
               "cpu_ms_per_layer": resident["cpu_ms"] / layers})
        budget = int(total * 0.5) if args.smoke else 12 * GB
        plan = planner.plan(spec, gpu_budget=budget)
        offloaded_layers = sum(1 for layer in plan.layers if layer.offloaded and "layers." in layer.name)
        with runtime.apply(plan, model, device=device):
            for path in ("direct", "ops"):
                real = prefetch_module.is_compiling
                if path == "ops":
                    prefetch_module.is_compiling = lambda: True
                try:
                    got = eager_costs(model, ids, device)
                finally:
                    prefetch_module.is_compiling = real
                per_layer = resident["cpu_ms"] / layers
                extra = (got["cpu_ms"] - resident["cpu_ms"]) / max(offloaded_layers, 1)
                write({"model": kind, "run": f"offloaded-{path}", "budget": budget, "backend": plan.summary.backend,
                       "offloaded_layers": offloaded_layers, "cpu_ms": got["cpu_ms"], "step_ms": got["step_ms"],
                       "cpu_ms_per_offloaded_layer": per_layer + extra,
                       "per_layer_over_hook_free": (per_layer + extra) / per_layer,
                       **compare(got["logits"], resident["logits"])})
        with HookClock() as clock:  # the hooks' own host time, whatever the GPU queue does
            with runtime.apply(plan, model, device=device), torch.no_grad():
                model(ids, use_cache=False)
                clock.seconds, n = 0.0, 30
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(n):
                    model(ids, use_cache=False)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                wall, cpu = (time.perf_counter() - t0) / n * 1e3, (time.process_time() - c0) / n * 1e3
                hooks_ms = clock.seconds / n * 1e3
        write({"model": kind, "run": "hook-time", "offloaded_layers": offloaded_layers, "hooks_ms_per_forward": hooks_ms,
               "hooks_us_per_offloaded_layer": hooks_ms * 1e3 / max(offloaded_layers, 1),
               "process_cpu_ms_per_forward": cpu, "wall_ms_per_forward": wall,
               "hook_free_layer_ms": resident["cpu_ms"] / layers,
               "offloaded_layer_over_hook_free": (resident["cpu_ms"] / layers + hooks_ms / max(offloaded_layers, 1))
               / (resident["cpu_ms"] / layers)})
        if kind == "llama" and not args.no_exact:
            prompt = torch.randint(0, config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(4)).to(device)
            with torch.no_grad():
                eager = model(prompt, use_cache=False).logits.clone()
                torch._dynamo.reset()
                compiled = torch.compile(model, mode="reduce-overhead")
                ref = [compiled(prompt, use_cache=False).logits.clone() for _ in range(4)][-1]
                torch._dynamo.reset()
            write({"model": kind, "run": "exact-resident-compiled-vs-eager", **compare(ref, eager)})
            plan8 = planner.plan(spec, gpu_budget=int(total * 0.3) if args.smoke else 8 * GB)
            with runtime.apply(plan8, model, device=device), torch.no_grad():
                off_eager = model(prompt, use_cache=False).logits.clone()
                compiled = torch.compile(model, mode="reduce-overhead")
                got = [compiled(prompt, use_cache=False).logits.clone() for _ in range(4)][-1]
                torch._dynamo.reset()
            write({"model": kind, "run": "exact-offloaded-eager-vs-eager", "backend": plan8.summary.backend,
                   **compare(off_eager, eager)})
            write({"model": kind, "run": "exact-offloaded-compiled-vs-resident-compiled", **compare(got, ref)})
            write({"model": kind, "run": "exact-offloaded-compiled-vs-eager", **compare(got, eager)})
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
