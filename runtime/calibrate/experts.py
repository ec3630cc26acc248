"""Grouped routed-expert matmuls, as a whole MoE model runs them: ``uva_expert_call_ms``, ``uva_expert_passes``,
``expert_tflops`` and ``expert_tflops_rows``, ``expert_gbps``."""

from __future__ import annotations

import statistics

import torch

from runtime.calibrate.cpu import tiny_moe
from runtime.calibrate.timers import gpu_ms
from runtime.uva import device_view

# the mean rows each of the 128 experts sees in ``moe_experts``' grouped calls: 16 to 32,768 tokens at top-8 (64 and
# 256 since 2026-12-03: between 32 and 128 the curve's line gave 1.16 passes at 64, where the dense curve measured
# 1.02, and priced a 1,024-token prefill's experts by it)
EXPERT_ROWS = (1, 2, 8, 32, 64, 128, 256, 512, 2048)


# from these rows an expert on, the resident module's time is its flops' (below, its reads and fixed costs: the
# block floor and expert_gbps hold those): the points of ``expert_tflops_rows``
COMPUTE_ROWS = 128


def _uniform_routing(experts: int, top_k: int, tokens: int, g: torch.Generator) -> torch.Tensor:
    """Each of ``tokens`` tokens picks ``top_k`` distinct experts uniformly at random (the cost model's uniform
    routing): [tokens, top_k]."""
    return torch.rand(tokens, experts, generator=g).argsort(dim=1)[:, :top_k]


def moe_experts(device: torch.device, uva_gbps: float) -> dict[str, object]:
    """Routed-expert matmuls, grouped as a whole model runs them: a Qwen3-MoE experts module (128 experts, hidden
    2048, width 768, top-8) with its weights resident and read through UVA.
    - ``uva_expert_call_ms``: at 1 and 32 tokens (random routing), the time beyond the bytes it reads per grouped
      matmul (two a call);
    - ``uva_expert_passes``: with uniform random routing at ``EXPERT_ROWS`` rows an expert on average, the bytes read
      over the link / the experts' bytes (a grouped kernel re-reads an expert's weight per tile of that expert's
      rows: an expert with one row more than a tile is read twice, so equal rows of exactly a tile, 128 an expert,
      read 1.03 times and random routing at the same mean 1.41: bench/probe_expert_passes.py, 2026-12-02);
    - ``expert_tflops``: the resident module's flops / its time at the most rows; ``expert_tflops_rows``: the same
      at each of ``EXPERT_ROWS`` from ``COMPUTE_ROWS`` on (on the H200 122 TFLOP/s at 128 rows an expert, 182 at
      512, 199 at 2,048: a 2,048-token prefill's experts run at the first, not the last);
    - ``expert_gbps``: with its weights resident, the touched experts' bytes over the time they add between 1 and
      32 tokens (8 and about 115 experts touched): the grouped kernels' read rate (the call's fixed time and the
      routing's kernels lie in ``moe_block_gpu_us``, measured less the experts' reads at this rate)."""
    try:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    except ImportError:
        return {}
    experts_n, top_k, hidden, width = 128, 8, 2048, 768
    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=width, num_experts=experts_n,
                            num_experts_per_tok=top_k)
    # the experts kernel a whole model picks (grouped_mm where available), not a bare module's fallback
    config._experts_implementation = getattr(tiny_moe(1).config, "_experts_implementation", None)
    experts = Qwen3MoeExperts(config).to(device, torch.bfloat16).eval()
    params = dict(experts.named_parameters())
    total = sum(p.numel() * p.element_size() for p in params.values())
    hosts = {name: p.detach().cpu().pin_memory() for name, p in params.items()}
    resident_params = {name: p.data for name, p in params.items()}

    def timed(index: torch.Tensor, repeat: int) -> tuple[float, float]:
        tokens = index.shape[0]
        weights = torch.full((tokens, top_k), 1 / top_k, dtype=torch.bfloat16, device=device)
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)
        with torch.inference_mode():
            for name, p in params.items():
                p.data = resident_params[name]
            # queued: the GPU's time alone (issued as it runs, a 1-token call's 31 kernels are the CPU's time:
            # expert_gbps came out 3.9 TB/s so on the H200, 2.7 queued, 2026-12-02)
            resident = gpu_ms(lambda: experts(x, index, weights), queued=True)
            for name, p in params.items():
                p.data = device_view(hosts[name], device)
            uva = gpu_ms(lambda: experts(x, index, weights), repeat=repeat)
            for name, p in params.items():
                p.data = resident_params[name]
        return resident, uva

    estimates, resident_points = [], []
    for tokens in (1, 32):
        g = torch.Generator().manual_seed(tokens)
        index = _uniform_routing(experts_n, top_k, tokens, g).to(device)
        hit = len(set(index.flatten().tolist()))
        resident, uva = timed(index, 5)
        read_ms = total * hit / experts_n / uva_gbps / 1e6
        estimates.append(max(0.0, (uva - max(read_ms, resident)) / 2))
        resident_points.append((total * hit / experts_n, resident))
    fixed = statistics.median(estimates)
    (few_bytes, few_ms), (many_bytes, many_ms) = resident_points  # 8 experts touched, then about 115
    expert_gbps = (many_bytes - few_bytes) / max(many_ms - few_ms, 1e-6) / 1e6
    read_ms = total / uva_gbps / 1e6
    points, raw = [], []
    g = torch.Generator().manual_seed(7)
    for rows in EXPERT_ROWS:
        index = _uniform_routing(experts_n, top_k, rows * experts_n // top_k, g).to(device)
        resident, uva = timed(index, 3)
        points.append({"tokens": rows, "passes": round(max(1.0, (uva - 2 * fixed) / read_ms), 3)})
        raw.append({"rows_an_expert": rows, "tokens": index.shape[0], "resident_ms": resident, "uva_ms": uva})
    for a, b in zip(points, points[1:]):  # passes never fall as the rows grow (a dip is the timing's noise)
        b["passes"] = max(a["passes"], b["passes"])
    by_rows = tflops_by_rows(raw, top_k, total / experts_n)
    return {"uva_expert_call_ms": fixed, "uva_expert_passes": points, "expert_tflops": by_rows[-1]["tflops"],
            "expert_tflops_rows": by_rows, "expert_gbps": expert_gbps, "raw_experts": raw}


def tflops_by_rows(raw: list[dict], top_k: int, expert_bytes: float) -> list[dict]:
    """``expert_tflops_rows`` from ``moe_experts``' resident timings (bf16 experts of ``expert_bytes`` each, every
    routed row a multiply-add with each weight): the points from ``COMPUTE_ROWS`` rows an expert on, never falling
    as the rows grow (a dip is the timing's noise)."""
    points = [{"tokens": r["rows_an_expert"],
               "tflops": round(2.0 * r["tokens"] * top_k * expert_bytes / 2 / r["resident_ms"] / 1e9, 3)}
              for r in raw if r["rows_an_expert"] >= COMPUTE_ROWS]
    for a, b in zip(points, points[1:]):
        b["tflops"] = max(a["tflops"], b["tflops"])
    return points
