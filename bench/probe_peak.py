"""Where a prefill's GPU peak is reached, and what is alive there, for this project's plan and diffusers'
best configuration at the same memory (Llama-3-8B shape, 2,048 tokens): a per-module trace of allocated
memory and the live allocations under 1 MiB at the LM head. Written to explain a 1 KiB difference between
the two peaks (docs/BENCHMARKS.md, "Against other offloaders").

    PYTHONPATH=.:bench:tests python bench/probe_peak.py --out $OUT/probe.json
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

import planner
import runtime
from bench_cost import build, inputs
from compare_diffusers import apply as apply_diffusers
from schemas.workload import Workload, WorkloadItem


def trace(model, ids) -> dict:
    """One prefill with hooks: per module (pre, post) allocated and peak bytes; live small blocks at lm_head."""
    rows, small = [], {}

    def pre(name):
        def hook(mod, args):
            rows.append((name, "pre", torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()))
            if name == "lm_head":
                snap = torch.cuda.memory._snapshot()
                for seg in snap["segments"]:
                    for b in seg["blocks"]:
                        if b["state"] == "active_allocated" and b["size"] < 2**20:
                            small[b["size"]] = small.get(b["size"], 0) + 1
        return hook

    def post(name):
        def hook(mod, args, out):
            rows.append((name, "post", torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()))
        return hook

    handles = []
    for name, mod in model.named_modules():
        if name.count(".") <= 2:
            handles += [mod.register_forward_pre_hook(pre(name)), mod.register_forward_hook(post(name))]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = model(ids, use_cache=False).logits
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    for h in handles:
        h.remove()
    first_at_peak = next((r for r in rows if r[3] == peak), None)
    del out
    return {"base": base, "peak_minus_base": peak - base, "first_hook_seeing_peak": first_at_peak,
            "rows": [(n, ph, a - base, m - base) for n, ph, a, m in rows], "small_blocks_at_lm_head": small}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device("cuda")
    master, config = build("llama", False, device)
    item = WorkloadItem(tokens=2048)
    ids = inputs(item, "prefill", config.vocab_size, device)
    spec = runtime.describe(master, name="llama")
    head = master.lm_head.weight
    plan = planner.plan(spec, gpu_budget=head.numel() * head.element_size(), strategy="auto",
                        workload=Workload({"prefill": item}))
    results = {"plan_peak": plan.summary.peak_gpu_bytes,
               "span": [layer.name for layer in plan.layers if layer.prefetch and layer.prefetch.span]}
    model = copy.deepcopy(master)
    handle = runtime.apply(plan, model, device="cuda")
    with torch.no_grad():
        model(ids, use_cache=False)
    results["ours"] = trace(model, ids)
    handle.remove()
    del model, handle
    torch.cuda.empty_cache()
    model = copy.deepcopy(master)
    apply_diffusers(model, "leaf-stream-record", device)
    with torch.no_grad():
        model(ids, use_cache=False)
    results["diffusers"] = trace(model, ids)
    for k in ("ours", "diffusers"):
        r = results[k]
        print(k, "peak-base", r["peak_minus_base"], "first at peak", r["first_hook_seeing_peak"][:2] if r["first_hook_seeing_peak"] else None,
              "small blocks at lm_head", sorted(r["small_blocks_at_lm_head"].items()))
        for row in r["rows"]:
            if row[0] in ("lm_head", "model.norm", "model.layers.31", "model.embed_tokens", "model", ""):
                print("   ", row)
    with open(args.out, "w") as f:
        json.dump(results, f, default=str)


if __name__ == "__main__":
    main()
