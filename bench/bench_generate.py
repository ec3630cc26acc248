"""Generation on an offloaded model as users run it (issue 17), against the same model resident.

    PYTHONPATH=. python bench/bench_generate.py --only llama --out $OUT/generate-llama.jsonl
    PYTHONPATH=. python bench/bench_generate.py --only moe --out $OUT/generate-moe.jsonl
    python bench/bench_generate.py --device cpu --smoke --out /tmp/generate.jsonl   # CPU smoke run

Per model (transformers, random bf16 weights built on the device; the Llama-3-8B shape at 8 and 12 GB, the
Qwen3-MoE shape at 12 and 20 GB by default), the resident model first, then ``auto``'s plan for a decode
step in CUDA graph replay at each budget, applied to the same model:

- ``generate()`` with transformers' static cache (its compiled decode step, replayed as CUDA graphs), greedy,
  for each prompt length (64 and 2,048 tokens by default) and 128 new tokens. One user-made ``StaticCache``
  sized for the longest prompt serves every call, so one compilation per plan covers every prompt. ms per
  token: the median interval between consecutive decode steps (CUDA events recorded by a logits processor),
  from the 8th step on (the first steps compile, warm up and record the graphs);
- the static cache compiled with the ``cudagraphs`` backend (the eager kernels, replayed as CUDA graphs) at the
  shortest prompt: the same kernels as eager, so the tokens must be the resident model's exactly;
- at the first budget also ``generate()`` with the dynamic cache (eager) and ``torch.compile(model,
  mode="reduce-overhead")`` on a plain forward loop (a 64-token forward, ``use_cache=False``).
Tokens (and the forward loop's logits) are compared with the resident model's, run the same way. Inductor's
``emulate_precision_casts`` is on for both (``--no-emulate`` turns it off): without it the resident model's
compiled graph fuses across the layer boundaries where the offload ops sit and rounds differently.

Each row also has the plan's predicted decode step in graph mode (and eager), and the link bound: the bytes
the plan moves over the host link per decode step (prefetched params, plus the share of UVA params a step
reads) at the pinned host-to-GPU rate measured in this run, or the resident step if larger.
"""

from __future__ import annotations

import argparse
import datetime
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
from schemas.kinds import param_kind  # noqa: E402
from planner.cost.expert_reads import touched_experts  # noqa: E402
from planner.cost.predict import predict  # noqa: E402
from schemas.hardware import load_hardware  # noqa: E402
from runtime.token_clock import TokenClock  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

GB = 10**9
BUDGETS = {"llama": (8 * GB, 12 * GB), "moe": (12 * GB, 20 * GB)}
SMOKE_SHARE = (0.5, 0.8)  # of the tiny models' bytes
SKIP_STEPS = 8


def run_generate(model, ids, new: int, device, cache=None, backend: str | None = None) -> dict:
    """Greedy generate; tokens, median decode ms per token (after SKIP_STEPS), peak GPU bytes. ``backend``:
    the static cache's compile backend (default transformers' inductor with CUDA-graph trees; ``cudagraphs``:
    the eager kernels replayed as CUDA graphs, so outputs can be compared bit for bit)."""
    from transformers import CompileConfig, LogitsProcessorList

    clock = TokenClock(device, skip=SKIP_STEPS)
    if cache is not None:
        cache.reset()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        kwargs = {"past_key_values": cache} if cache is not None else {"cache_implementation": "dynamic"}
        if backend is not None:
            kwargs["compile_config"] = CompileConfig(backend=backend, mode="default")
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                             eos_token_id=None, logits_processor=LogitsProcessorList([clock]), **kwargs)
    wall = time.perf_counter() - t0
    steps = clock.intervals_ms()
    return {"tokens": out[0, ids.shape[1]:].tolist(), "ms_per_token": clock.ms_per_token(),
            "steps_timed": len(steps[SKIP_STEPS:] or steps), "wall_s": round(wall, 2),
            "peak_gpu_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None}


def run_loop(model, ids, device, steps: int = 6) -> dict:
    """torch.compile(model, mode="reduce-overhead") on a forward loop: the last logits and the median step."""
    compiled = torch.compile(model, mode="reduce-overhead")
    times, logits = [], None
    with torch.no_grad():
        for _ in range(steps):
            t0 = time.perf_counter()
            logits = compiled(ids, use_cache=False).logits.clone()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append((time.perf_counter() - t0) * 1e3)
    return {"logits": logits, "ms": statistics.median(times[3:] or times)}


def h2d_gbps(device: torch.device, nbytes: int = 1 << 30) -> float | None:
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for _ in range(2):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        dst.copy_(src, non_blocking=True)
    end.record()
    torch.cuda.synchronize(device)
    return 5 * nbytes / (start.elapsed_time(end) * 1e6)


def moved_bytes(plan, tokens: int = 1) -> float:
    """Bytes over the host link per forward at ``tokens``: prefetched params whole, UVA params as read (routed
    experts: the share a step touches)."""
    total = 0.0
    for layer in plan.layers:
        uva = set(layer.uva)
        for rel in layer.offloaded:
            p = layer.params[rel]
            kind = p.kind or param_kind(layer.name, rel)  # a plan names a kind only where the spec did
            share = 1.0
            if rel in uva and layer.moe is not None and kind == "routed_experts":
                share = touched_experts(layer.moe.experts, layer.moe.top_k, tokens) / layer.moe.experts
            elif rel in uva and kind == "embedding" and "lm_head" not in layer.name:  # a lookup reads its rows
                share = min(1.0, tokens / p.shape[0])
            total += p.bytes * share
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny models (a CPU run of every code path)")
    ap.add_argument("--only", choices=["llama", "moe"])
    ap.add_argument("--prompts", default="64,2048")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--no-emulate", action="store_true")
    ap.add_argument("--budgets", default=None, help="GB, comma-separated (default: the model's two)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    prompts = [int(p) for p in args.prompts.split(",")]
    if args.smoke:
        prompts, args.new_tokens = [8, 16], 12
    torch._inductor.config.emulate_precision_casts = not args.no_emulate
    hw = load_hardware("h200")
    link = h2d_gbps(device)
    out = open(args.out, "w")

    def write(row: dict) -> None:
        out.write(json.dumps(row, default=str) + "\n")
        out.flush()
        print(json.dumps({k: v for k, v in row.items() if k not in ("tokens", "want")}, default=str), flush=True)

    write({"type": "env", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "transformers": __import__("transformers").__version__,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "h2d_gbps": link, "emulate_precision_casts": not args.no_emulate, "argv": sys.argv})
    for kind in ([args.only] if args.only else ["llama", "moe"]):
        from transformers import StaticCache

        model, config = build(kind, args.smoke, device)
        spec = runtime.describe(model, name=kind)
        if args.smoke:  # a CPU run has no library workspaces (as bench_memory.py's dry run)
            spec = spec.model_copy(update={"memory": spec.memory.model_copy(update={"workspace": 0, "graphs": 0})})
        total = sum(t.nbytes for layer in spec.model.expanded() for t in layer.params)
        budgets = [int(total * s) for s in SMOKE_SHARE] if args.smoke else BUDGETS[kind]
        if args.budgets:
            budgets = [int(float(b) * GB) for b in args.budgets.split(",")]
        g = torch.Generator().manual_seed(1)
        inputs = {p: torch.randint(0, config.vocab_size, (1, p), generator=g).to(device) for p in prompts}
        cache = StaticCache(config=config, max_cache_len=max(prompts) + args.new_tokens + 8)
        torch._dynamo.reset()
        ref = {p: run_generate(model, ids, args.new_tokens, device, cache) for p, ids in inputs.items()}
        for p, r in ref.items():
            write({"type": "resident", "model": kind, "run": "static", "prompt": p, **r})
        short = inputs[prompts[0]]
        torch._dynamo.reset()
        ref_cg = run_generate(model, short, args.new_tokens, device, cache, backend="cudagraphs")
        write({"type": "resident", "model": kind, "run": "static-cudagraphs", "prompt": prompts[0], **ref_cg})
        ref_dyn = run_generate(model, short, 32, device)
        write({"type": "resident", "model": kind, "run": "dynamic", "prompt": prompts[0], **ref_dyn})
        torch._dynamo.reset()
        ref_loop = run_loop(model, short, device)
        write({"type": "resident", "model": kind, "run": "compile-loop", "prompt": prompts[0], "ms": ref_loop["ms"]})
        torch._dynamo.reset()
        workload = Workload({"decode": WorkloadItem(tokens=1, mode="graph")})
        eager = Workload({"decode": WorkloadItem(tokens=1)})
        for i, budget in enumerate(budgets):
            plan = planner.plan(spec, gpu_budget=budget, workload=workload)
            s = plan.summary
            moved = moved_bytes(plan)
            base = {"type": "offloaded", "model": kind, "budget": budget, "backend": s.backend,
                    "plan_peak_gpu_bytes": s.peak_gpu_bytes, "offloaded_bytes": s.offloaded_bytes,
                    "moved_bytes_per_step": moved,
                    "predicted_graph_ms": plan.predictions.workloads[0].step_ms,
                    "predicted_eager_ms": predict(plan, hw, eager).workloads[0].step_ms}
            try:
                with runtime.apply(plan, model, device=device):
                    for p, ids in inputs.items():
                        r = run_generate(model, ids, args.new_tokens, device, cache)
                        bound = max(ref[prompts[0]]["ms_per_token"] or 0.0, moved / (link * 1e6) if link else 0.0)
                        write({**base, "run": "static", "prompt": p, **r, "same_tokens": r["tokens"] == ref[p]["tokens"],
                               "link_bound_ms": bound,
                               "over_prediction": r["ms_per_token"] / base["predicted_graph_ms"],
                               "over_link_bound": r["ms_per_token"] / bound if bound else None})
                    torch._dynamo.reset()
                    r = run_generate(model, short, args.new_tokens, device, cache, backend="cudagraphs")
                    write({**base, "run": "static-cudagraphs", "prompt": prompts[0], **r,
                           "same_tokens": r["tokens"] == ref_cg["tokens"],
                           "over_prediction": r["ms_per_token"] / base["predicted_graph_ms"]})
                    if i == 0:
                        r = run_generate(model, short, 32, device)
                        write({**base, "run": "dynamic", "prompt": prompts[0], **r,
                               "same_tokens": r["tokens"] == ref_dyn["tokens"],
                               "over_prediction_eager": r["ms_per_token"] / base["predicted_eager_ms"]})
                        torch._dynamo.reset()
                        loop = run_loop(model, short, device)
                        diff = (loop["logits"].float() - ref_loop["logits"].float()).abs().max().item()
                        write({**base, "run": "compile-loop", "prompt": prompts[0], "ms": loop["ms"],
                               "same_logits": bool(torch.equal(loop["logits"], ref_loop["logits"])),
                               "max_abs_diff": diff})
                    torch._dynamo.reset()
            except Exception as exc:  # noqa: BLE001 - one failed plan becomes an error row
                import traceback

                write({**base, "run": "error", "error": repr(exc), "trace": traceback.format_exc()[-3000:]})
                torch._dynamo.reset()
        del model, cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
