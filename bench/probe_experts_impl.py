"""Transformers' two experts kernels on a plan whose routed experts are read through UVA (issue 17).

    PYTHONPATH=. python bench/probe_experts_impl.py > $OUT/experts-impl.jsonl          # the H200
    PYTHONPATH=. python bench/probe_experts_impl.py --device cpu --small --budget 0.5  # every code path, any machine

Why: the Qwen3-MoE shape's decode with experts on UVA took 1.37-1.68x the bytes it moves at the link's rate
(docs/BENCHMARKS.md, "Generation as users run it"), and one grouped experts call reading 8 experts through UVA
took 1.34x those experts' bytes (``bench/probe_uva_paths.py``). Transformers 5 has a second kernel,
``batched_mm``: each (token, choice) pair's expert weights are gathered (``gate_up_proj[expert_ids]``, a
copy kernel over the pairs) and one batched matmul a projection runs on the gathered copy. Through UVA the
gather reads each chosen expert once with every SM, where the grouped kernel's tiles read in place.

Here: the Qwen3-MoE shape (random bf16 weights), resident and then with ``auto``'s plan at ``--budget`` GB for a
decode step in graph mode, a forward of ``T`` tokens (no cache: the experts' share of a decode step) with each
kernel (``model.set_experts_implementation``): eager and CUDA graph replay (CUDA events, median), the logits
against the resident model's with the same kernel, and the batched kernel's against the grouped one's."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import planner  # noqa: E402
import runtime  # noqa: E402
from bench_memory import Setup, build  # noqa: E402
from runtime.calibrate import captured, gpu_ms  # noqa: E402
from runtime.timing import wall_ms  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

GB = 10**9
KERNELS = ("grouped_mm", "batched_mm")


def timed(fn, device: torch.device) -> float:
    return gpu_ms(fn, repeat=7, warmup=2) if device.type == "cuda" else wall_ms(fn, 3, warmup=1)


def measure(model, ids: torch.Tensor, device: torch.device) -> dict:
    def forward():
        return model(ids, use_cache=False).logits

    with torch.no_grad():
        logits = forward().clone()
        row = {"eager_ms": round(timed(forward, device), 3)}
        if device.type == "cuda":
            graph, out = captured(forward, warmup=1)
            graph.replay()
            row["graph_ms"] = round(timed(graph.replay, device), 3)
            row["graph_same_as_eager"] = bool(torch.equal(out, logits))
    return {**row, "logits": logits}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="bench_memory's tiny Qwen3-MoE (a CPU check)")
    ap.add_argument("--budget", type=float, default=12.0, help="GB; with --small, a share of the weights")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 32])
    args = ap.parse_args(argv)
    setup = Setup(args.small, args.device)
    device = setup.device
    model, config = build("moe", setup)
    spec = runtime.describe(model, name="moe")
    workload = Workload({"decode": WorkloadItem(tokens=1, mode="graph")})
    if args.small:  # a share of the weights beside what the plan counts besides them
        weights = sum(layer.nbytes for layer in spec.model.expanded())
        besides = planner.plan(spec, backend="none", workload=workload).memory.non_weight_bytes
        budget = int(weights * args.budget) + besides
    else:
        budget = int(args.budget * GB)
    plan = planner.plan(spec, gpu_budget=budget, workload=workload)
    print(json.dumps({"kind": "plan", "budget": budget, "backend": plan.summary.backend,
                      "offloaded_bytes": plan.summary.offloaded_bytes, "notes": plan.summary.notes}), flush=True)
    g = torch.Generator().manual_seed(3)
    inputs = {t: torch.randint(0, config.vocab_size, (1, t), generator=g).to(device) for t in args.tokens}

    def rows(placed: str, ref: dict | None) -> dict:
        out = {}
        for kernel in KERNELS:
            model.set_experts_implementation(kernel)
            for t, ids in inputs.items():
                r = measure(model, ids, device)
                logits = r.pop("logits")
                out[kernel, t] = logits
                row = {"kind": "step", "placed": placed, "kernel": kernel, "tokens": t, **r}
                if ref is not None:
                    row["same_as_resident"] = bool(torch.equal(logits, ref[kernel, t]))
                if kernel != KERNELS[0]:
                    row["max_abs_diff_vs_grouped"] = (logits.float() - out[KERNELS[0], t].float()).abs().max().item()
                print(json.dumps(row), flush=True)
        return out

    resident = rows("resident", None)
    with runtime.apply(plan, model, device=device):
        rows("offloaded", resident)
    return 0


if __name__ == "__main__":
    sys.exit(main())
