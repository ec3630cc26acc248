"""The layer graphs' GPU memory (runtime/shape_graphs.py; issue 21) against what the plan counts for them
(``memory.graph_bytes``, planner/memory/graphs.py).

    PYTHONPATH=. python bench/probe_graph_memory.py --out $OUT/graph-memory.jsonl      # the H200 (about 2 min)
    python bench/probe_graph_memory.py --dry-run --out /tmp/graph-memory.jsonl        # tiny shapes on the CPU

The Qwen3-MoE shape at 12 GB (bench_moe_hybrid.py's model and budget), the all-UVA plan and auto's plan for
decode 32 (split layers with a host part beside resident ones), each applied with the layer graphs and without.
For eager decode batches of 1 to 64 tokens in turn, eight shapes (the most a plan's graphs hold; two steps each:
the second captures a new shape), after each batch: the GPU memory allocated (``torch.cuda.memory_allocated``,
the device synchronized) and reserved once the cache is emptied (``torch.cuda.memory_reserved`` after
``empty_cache``: the graphs' pool keeps its segments) less what they were before the first batch, with the graphs
and without; the bytes the graphs' static inputs and outputs hold (``Handle.stats()["expert_graphs"]["bytes"]``)
and schemas/expert_graphs.py's bound on them for the shapes held; the segments the allocator keeps in the graphs'
pool (``pool_bytes``: reserved for the graphs alone, where the static tensors' blocks sit among the model's own);
and the plan's ``memory.graph_bytes``, which should hold the pool's segments and the static tensors (``held``). On the
CPU (``--dry-run``) nothing is captured: the rows are the same, their GPU figures zero.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_moe_hybrid as h  # noqa: E402

import runtime  # noqa: E402
from schemas.expert_graphs import static_bytes  # noqa: E402

TOKENS = (1, 2, 4, 8, 16, 32, 48, 64)


def held(device: torch.device) -> tuple[int, int]:
    """(allocated, reserved once the allocator's cache is emptied) on ``device``; (0, 0) off a GPU."""
    if device.type != "cuda":
        return 0, 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)


def estimate(handle, hidden: int, k: int) -> int:
    """schemas/expert_graphs.py's static bytes of the shapes ``handle``'s graphs were captured for (bf16)."""
    pool = handle._graphs
    if pool is None:
        return 0
    return sum(static_bytes(key[0][0][0], hidden, k, 2) for key in pool.statics)  # a key's first input: [T, hidden]


def grow(bench: h.Bench, label: str, plan, model, config, graphs: bool) -> list[dict]:
    """Apply ``plan`` (with the layer graphs or without), run the batches, one row a batch."""
    handle = runtime.apply(plan, model, device=str(bench.device), expert_graphs=graphs)
    out = []
    try:
        base = held(bench.device)
        for tokens in TOKENS:
            ids = bench.ids((tokens, 1), config.vocab_size, seed=tokens)
            with torch.inference_mode():
                model(ids, use_cache=False)
                model(ids, use_cache=False)  # a shape's second call captures its graphs
            stats = handle.stats().get("expert_graphs") or {}
            now = held(bench.device)
            out.append({"tokens": tokens, "allocated": now[0] - base[0], "reserved": now[1] - base[1],
                        "graphs": stats.get("graphs", 0), "bytes": stats.get("bytes", 0),
                        "pool_bytes": stats.get("pool_bytes", 0),
                        "estimate": estimate(handle, config.hidden_size, config.num_experts_per_tok)})
    finally:
        handle.remove()
        if bench.device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def run(args: argparse.Namespace) -> int:
    bench = h.Bench(argparse.Namespace(dry_run=args.dry_run, out=args.out, device="cpu" if args.dry_run else "cuda",
                                       cases=["decode32"], profile=args.profile))
    model, config = bench.build("qwen3_moe")
    spec = runtime.describe(model, name="qwen3_moe")
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = int(total * 0.45) if bench.dry else h.BUDGETS["qwen3_moe"]
    plans = {"uva": bench.plan(spec, budget, 32, backend="uva", kinds=["routed_experts"]),
             "auto decode32": bench.plan(spec, budget, 32)}
    for label, plan in plans.items():
        launched = grow(bench, label, plan, model, config, graphs=False)
        graphed = grow(bench, label, plan, model, config, graphs=True)
        for off, on in zip(launched, graphed):
            bench.emit(model="qwen3_moe", plan=label, backend=plan.summary.backend, tokens=on["tokens"],
                       graphs=on["graphs"], static_bytes=on["bytes"], estimate_bytes=on["estimate"],
                       allocated_with=on["allocated"], allocated_without=off["allocated"],
                       graphs_allocated=on["allocated"] - off["allocated"],
                       reserved_with=on["reserved"], reserved_without=off["reserved"],
                       graphs_reserved=on["reserved"] - off["reserved"],
                       pool_bytes=on["pool_bytes"], held=on["pool_bytes"] + on["bytes"],
                       plan_graph_bytes=plan.memory.graph_bytes,
                       within_plan=on["pool_bytes"] + on["bytes"] <= plan.memory.graph_bytes)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the rows (JSON lines), also printed")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (no graphs: the rows' GPU "
                    "figures are zero)")
    ap.add_argument("--profile", default="h200", help="the hardware profile plans are made with")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
