"""Predicted against measured step time, with a profile calibrated in the same run.

    python bench/bench_cost.py --out bench/results/cost.jsonl          # the H200 run (~6 min)
    python bench/bench_cost.py --small --device cpu --out /tmp/c.jsonl # a CPU smoke run of the script

Models (transformers, random weights, bf16): a Llama-3-8B shape (32 layers, hidden 4096, 16 GB) at
two budgets x {prefetch, UVA} x {decode b=1, decode b=32, prefill 2,048}; a Qwen3-MoE shape (24
layers, 128 experts, top-8, 31 GB) with the routed experts on UVA and on prefetch x {decode b=1,
b=32}. Each row: the plan's predicted step (planner.plan with the calibrated profile), the
measured median of CUDA-event timings, and their ratio. MoE rows also count the distinct experts
each layer's router picked, against the uniform-routing expectation the cost model uses.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402
from planner.cost.expert_reads import touched_experts  # noqa: E402
from runtime.calibrate import gpu_ms  # noqa: E402
from runtime.timing import wall_ms  # noqa: E402
from schemas.hardware import load_hardware  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

LLAMA = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8)
QWEN_MOE = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[])
SMALL_LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=2)
SMALL_MOE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, num_experts=16, num_experts_per_tok=4,
                 moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[])


def timer(device: torch.device, fn, repeat: int, warmup: int) -> float:
    """Median ms of ``fn`` after ``warmup`` runs: CUDA events on the GPU (runtime.calibrate's timer),
    wall clock on the CPU."""
    with torch.inference_mode():
        gc.collect()
        if device.type == "cuda":
            return gpu_ms(fn, repeat=repeat, warmup=warmup)
        return wall_ms(fn, repeat, warmup)


def random_model(cls, config, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """``cls(config)`` in eval mode with random weights (seed 0), made in ``dtype`` directly on ``device``."""
    from runtime.calibrate.block import built

    torch.manual_seed(0)
    return built(lambda: cls(config).eval(), device, dtype)


def build(kind: str, small: bool, device: torch.device):
    import transformers

    if kind == "llama":
        config = transformers.LlamaConfig(**(SMALL_LLAMA if small else LLAMA))
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen3MoeConfig(**(SMALL_MOE if small else QWEN_MOE))
        cls = transformers.Qwen3MoeForCausalLM
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    return random_model(cls, config, device, dtype), config


def inputs(workload: WorkloadItem, name: str, vocab: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    shape = (1, workload.tokens) if name.startswith("prefill") else (workload.tokens, 1)
    return torch.randint(0, vocab, shape, generator=g).to(device)


class ExpertCounter:
    """Distinct experts each MoE router picks in one forward (hooks on the routers)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.hit: dict[str, set[int]] = {}
        self.hooks = []
        for name, module in model.named_modules():
            if hasattr(module, "top_k") and hasattr(module, "num_experts") and name.endswith("gate"):
                self.hooks.append(module.register_forward_hook(self._hook(name)))

    def _hook(self, name: str):
        def hook(_m, _args, out):
            picked = [t for t in (out if isinstance(out, tuple) else (out,))
                      if isinstance(t, torch.Tensor) and not t.is_floating_point()]
            if picked:
                self.hit.setdefault(name, set()).update(picked[-1].flatten().tolist())
        return hook

    def counts(self) -> list[int]:
        return [len(v) for v in self.hit.values()]

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


def record_stats(plan, model, config, device, path: Path) -> None:
    """Handle.stats() of five decode forwards with per-layer CUDA-event timing, for `planner explain`."""
    ids = inputs(WorkloadItem(tokens=1), "decode", config.vocab_size, device)
    handle = runtime.apply(plan, model, device=str(device), stats=True)
    try:
        with torch.inference_mode():
            for _ in range(5):
                model(ids, use_cache=False)
        path.write_text(json.dumps(handle.stats(), indent=1))
    finally:
        handle.remove()


def run_rows(kind: str, model, config, hw, cases, workload: Workload, device, args, out) -> None:
    spec = runtime.describe(model, name=kind)
    for label, options in cases:
        try:
            plan = planner.plan(spec, hardware=hw, workload=workload, **options)
        except InfeasibleError as err:
            options = dict(options, gpu_budget=err.min_gpu_budget)
            plan = planner.plan(spec, hardware=hw, workload=workload, **options)
            label += f" (budget raised to {err.min_gpu_budget / 1e9:.2f} GB)"
        predicted = {p.workload: p for p in plan.predictions.workloads}
        handle = runtime.apply(plan, model, device=str(device))
        try:
            for name, item in workload.items():
                ids = inputs(item, name, config.vocab_size, device)
                slow = item.tokens >= 2048 and plan.summary.backend == "uva"
                repeat = 3 if args.small else (5 if slow else 15)
                counter = ExpertCounter(model) if kind == "moe" else None
                ms = timer(device, lambda: model(ids, use_cache=False), repeat=repeat, warmup=2)
                experts = None
                if counter is not None:
                    counter.hit.clear()
                    with torch.inference_mode():
                        model(ids, use_cache=False)
                    counts = counter.counts()
                    counter.close()
                    expected = touched_experts(config.num_experts, config.num_experts_per_tok, item.tokens)
                    experts = {"per_layer": counts, "mean": statistics.mean(counts) if counts else None,
                               "uniform_expectation": round(expected, 2)}
                p = predicted[name]
                row = {"model": kind, "plan": label, "backend": plan.summary.backend,
                       "gpu_budget": plan.summary.gpu_budget_bytes, "peak_gpu_bytes": plan.summary.peak_gpu_bytes,
                       "offloaded_bytes": plan.summary.offloaded_bytes, "prefetch_step": plan.summary.prefetch_step,
                       "workload": name, "tokens": item.tokens, "predicted_ms": p.step_ms, "measured_ms": round(ms, 3),
                       "ratio": round(p.step_ms / ms, 4), "bound": p.bound, "predicted": p.model_dump(),
                       "experts": experts}
                print(f"{kind:6} {label:34} {name:9} predicted {p.step_ms:9.2f} ms  measured {ms:9.2f} ms  "
                      f"pred/meas {p.step_ms / ms:5.3f}  ({p.bound})"
                      + (f"  experts/layer {experts['mean']:.1f} (uniform {experts['uniform_expectation']})"
                         if experts else ""), flush=True)
                out.write(json.dumps(row) + "\n")
                out.flush()
        finally:
            handle.remove()
        if kind == "llama" and label.startswith("prefetch 8GB"):
            Path(args.out).with_suffix(".plan.yaml").write_text(__import__("schemas").dump_model(plan))
            record_stats(plan, model, config, device, Path(args.out).with_suffix(".stats.json"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--profile", help="use this profile instead of calibrating (CPU smoke runs)")
    ap.add_argument("--only", choices=["llama", "moe"])
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.profile or device.type != "cuda":
        hw = load_hardware(args.profile or "h200")
    else:
        from runtime.calibrate import calibrate

        t0 = time.perf_counter()
        hw, raw = calibrate(device, "h200-calibrated")
        print(f"calibrated in {time.perf_counter() - t0:.1f} s: {hw.model_dump()}", flush=True)
        Path(args.out).with_suffix(".profile.yaml").write_text(__import__("schemas").dump_model(hw))
    gb = 1 if args.small else 10**9
    with open(args.out, "w") as out:
        out.write(json.dumps({"profile": hw.model_dump(), "torch": torch.__version__,
                              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}) + "\n")
        if args.only in (None, "llama"):
            model, config = build("llama", args.small, device)
            total = sum(p.numel() * p.element_size() for p in model.parameters())
            budgets = [int(total * 0.4), int(total * 0.7)] if args.small else [8 * gb, 12 * gb]
            cases = [("no offload", {"backend": "none"})]
            for b in budgets:
                for backend in ("prefetch", "uva"):
                    cases.append((f"{backend} {b / 1e9:.0f}GB" if not args.small else f"{backend} {b}B",
                                  {"gpu_budget": b, "backend": backend}))
            workload = Workload({"decode": WorkloadItem(tokens=1), "decode32": WorkloadItem(tokens=32),
                                 "prefill": WorkloadItem(tokens=2048 if not args.small else 64)})
            run_rows("llama", model, config, hw, cases, workload, device, args, out)
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if args.only in (None, "moe"):
            model, config = build("moe", args.small, device)
            total = sum(p.numel() * p.element_size() for p in model.parameters())
            budget = int(total * 0.5) if args.small else 12 * gb
            cases = [("no offload", {"backend": "none"}),
                     ("experts on uva", {"gpu_budget": budget, "backend": "uva", "kinds": ["routed_experts"]}),
                     ("experts on prefetch, 2 slots", {"gpu_budget": budget, "backend": "prefetch",
                                                       "kinds": ["routed_experts"], "prefetch_step": 2})]
            workload = Workload({"decode": WorkloadItem(tokens=1), "decode32": WorkloadItem(tokens=32)})
            run_rows("moe", model, config, hw, cases, workload, device, args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
