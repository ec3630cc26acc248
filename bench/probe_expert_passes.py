"""Grouped expert matmuls reading UVA weights: re-reads by rows an expert, and whether skewed routing costs what
the per-expert curve says (issue 19: MoE prefill through UVA was predicted 0.82-0.85 of measured with the grouped
curve and 1.07-1.10 with the dense one, bench/results/predict-h200-2026-12-02d).

    PYTHONPATH=. python bench/probe_expert_passes.py > $OUT/expert-passes.json

``runtime.calibrate.moe_experts`` (uniform random routing at a mean of rows an expert), then the same module at 2,048 tokens whose
experts are drawn from a Zipf-like law (expert e picked with weight 1/(e+1)^s, 8 distinct a token) for a few s:
measured UVA time against the time the curve gives each touched expert at its own rows."""
import json

import torch

from runtime import calibrate as c
from runtime.uva import device_view
from schemas.hardware import load_hardware
from schemas.hardware_profile import UvaPoint


def main() -> None:
    device = torch.device("cuda")
    uva = float(c.matmuls(device)["uva_gbps"])
    found = c.moe_experts(device, uva)
    # the curve as the cost model reads it (HardwareProfile.expert_passes)
    curve_of = load_hardware("h200").model_copy(
        update={"uva_expert_passes": [UvaPoint(**p) for p in found["uva_expert_passes"]]})
    passes = curve_of.expert_passes

    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8)
    config._experts_implementation = getattr(c.tiny_moe(1).config, "_experts_implementation", None)
    experts = Qwen3MoeExperts(config).to(device, torch.bfloat16).eval()
    total = sum(p.numel() * p.element_size() for p in experts.parameters())
    for p in experts.parameters():
        p.data = device_view(p.detach().cpu().pin_memory(), device)
    skewed = []
    for s in (0.0, 0.5, 1.0, 1.5):
        g = torch.Generator().manual_seed(11)
        law = 1.0 / torch.arange(1, 129, dtype=torch.float) ** s
        for tokens in (32, 2048):
            index = torch.multinomial(law.expand(tokens, 128), 8, replacement=False, generator=g).to(device)
            rows = torch.bincount(index.flatten(), minlength=128).tolist()
            weights = torch.full((tokens, 8), 1 / 8, dtype=torch.bfloat16, device=device)
            x = torch.randn(tokens, 2048, dtype=torch.bfloat16, device=device)
            with torch.inference_mode():
                ms = c.gpu_ms(lambda: experts(x, index, weights), repeat=3)
            per = total / 128 / uva / 1e6
            curve = 2 * found["uva_expert_call_ms"] + sum(per * passes(r) for r in rows if r)
            once = 2 * found["uva_expert_call_ms"] + sum(per for r in rows if r)
            skewed.append({"s": s, "tokens": tokens, "touched": sum(1 for r in rows if r), "max_rows": max(rows),
                           "measured_ms": round(ms, 3), "curve_ms": round(curve, 3), "read_once_ms": round(once, 3),
                           "measured_over_curve": round(ms / curve, 3)})
            print(json.dumps(skewed[-1]), flush=True)
    print(json.dumps({"uva_gbps": uva, **found, "skewed": skewed}))


if __name__ == "__main__":
    main()
