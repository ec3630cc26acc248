"""Probe (2026-12-02): a decoder block's GPU time timed as issued against queued (``calibrate.gpu_ms(queued=True)``),
and routed experts read through UVA at prefill's rows per expert: transformers' experts module and the runtime's
split part (runtime/expert_math.py ``part_rows``), each resident and through UVA, as passes over the touched
experts' bytes. One JSON line per measurement.

    PYTHONPATH=. python bench/probe_uva_experts.py          # the H200, about a minute
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from runtime import calibrate  # noqa: E402
from runtime.expert_math import Layout, part_rows  # noqa: E402
from runtime.uva import device_view  # noqa: E402


def emit(**row):
    print(json.dumps(row), flush=True)


def blocks(device):
    for queued in (False, True):
        timer = (lambda fn: calibrate.gpu_ms(fn, queued=True)) if queued else calibrate.gpu_ms
        got = calibrate.block_compute(device, 803.0, 2863.0, timer=timer)
        emit(what="block", queued=queued, **got)


def experts(device, name, cfg_cls, experts_cls, cfg, n, k, tokens_list, uva_gbps=52.5):
    config = cfg_cls(**cfg)
    config._experts_implementation = "grouped_mm"
    mod = experts_cls(config).to(device, torch.bfloat16).eval()
    params = dict(mod.named_parameters())
    hosts = {p: t.detach().cpu().pin_memory() for p, t in params.items()}
    resident = {p: t.data for p, t in params.items()}
    views = {p: device_view(hosts[p], device) for p in params}
    total = sum(t.numel() * t.element_size() for t in params.values())
    layout = Layout.of(mod)
    table = torch.arange(n, device=device)
    for tokens in tokens_list:
        g = torch.Generator().manual_seed(tokens)
        index = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(tokens)]).to(device)
        w = torch.full((tokens, k), 1 / k, dtype=torch.bfloat16, device=device)
        x = torch.randn(tokens, config.hidden_size, dtype=torch.bfloat16, device=device)
        hit = len(set(index.flatten().tolist()))
        touched = total * hit / n
        row = {"what": "experts", "model": name, "tokens": tokens, "rows_per_expert": round(tokens * k / n, 2),
               "touched_bytes": int(touched)}
        with torch.inference_mode():
            for place, data in (("resident", resident), ("uva", views)):
                for p, t in params.items():
                    t.data = data[p]
                ms_hf = calibrate.gpu_ms(lambda: mod(x, index, w), repeat=5, queued=True)
                weights = {p: t for p, t in data.items()}
                ms_part = calibrate.gpu_ms(lambda: part_rows(mod, layout, weights, table, x, index, w), repeat=5,
                                           queued=True)
                row[f"{place}_hf_ms"], row[f"{place}_part_ms"] = round(ms_hf, 3), round(ms_part, 3)
            for p, t in params.items():
                t.data = resident[p]
        link = touched / uva_gbps / 1e6
        row["link_ms"] = round(link, 3)
        row["passes_hf"] = round(row["uva_hf_ms"] / link, 3)
        row["passes_part"] = round(row["uva_part_ms"] / link, 3)
        emit(**row)
    del mod, hosts, views
    torch.cuda.empty_cache()


def main():
    device = torch.device("cuda")
    emit(what="env", torch=torch.__version__, gpu=torch.cuda.get_device_name(device))
    blocks(device)
    from transformers import PhimoeConfig, Qwen3MoeConfig
    from transformers.models.phimoe.modeling_phimoe import PhimoeExperts
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    experts(device, "qwen3", Qwen3MoeConfig, Qwen3MoeExperts,
            dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8), 128, 8,
            (1, 32, 256, 512, 1024, 2048))
    experts(device, "phimoe", PhimoeConfig, PhimoeExperts,
            dict(hidden_size=4096, intermediate_size=6400, num_local_experts=16, num_experts_per_tok=2), 16, 2,
            (1, 32, 256, 1024, 2048))


if __name__ == "__main__":
    main()
