"""Why a 2,048-token prefill replayed as one CUDA graph is slower than its kernels queued eagerly (issue 19).

    PYTHONPATH=. python bench/probe_replay_kernels.py > $OUT/replay-kernels.jsonl     # the H200

On 2026-12-02 ``bench/probe_block_stack.py`` measured the Llama-3-8B shape's resident prefill of 2,048 tokens
at 60.48 ms queued (the CPU issues the whole forward while the stream sleeps, so the kernels run back to back)
and 67.90 ms replayed as one CUDA graph. Here, in one process: both timings again, then the CUDA kernels of one
queued forward and of one replay under torch.profiler, summed by kernel name (count and GPU microseconds), so
that a kernel chosen differently under capture (cuBLAS's algorithm, SDPA's backend) or a kernel slower under
capture shows by name; and the same for a single matmul and a single SDPA call of the shape's sizes.

    PYTHONPATH=. python bench/probe_replay_kernels.py --moe-decode > $OUT/moe-decode-kernels.jsonl

The resident Qwen3-MoE shape's (24 layers) decode step of one token, queued and replayed, by kernel name (the cost
model predicted its replay at 4.77 ms against 6.13 measured on 2026-12-02: where does the 1.4 ms go?), and a
Qwen3-MoE experts module alone with its weights in GPU memory at 1, 8 and 32 tokens (top-8 of 128, random routing).

    PYTHONPATH=. python bench/probe_replay_kernels.py --decode-rows > $OUT/decode-rows-kernels.jsonl

The resident Llama-3-8B shape's decode step at 1 and at 32 sequences, queued and replayed, by kernel name: the
model replays 1.26x slower at 32 (8.9 against 7.1 ms, 2026-12-02) where one of its blocks replayed alone is 1.15x
slower (calibrate's ``block_reads``): which kernels take the rest?"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_memory import Setup, build  # noqa: E402
from runtime import calibrate as c  # noqa: E402

TOKENS = 2048


def kernels(fn, runs: int = 2) -> dict[str, list[float]]:
    """{kernel name: [count, total GPU us]} over ``runs`` calls of ``fn`` (per call)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    table: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            table[e.name][0] += 1 / runs
            table[e.name][1] += e.device_time / runs  # us
    return dict(table)


def compare(label: str, fn) -> None:
    queued = c.gpu_ms(fn, repeat=5, queued=True)
    graph, _ = c.captured(fn)
    replay = c.gpu_ms(graph.replay, repeat=5, warmup=2)
    eager_k, graph_k = kernels(fn), kernels(graph.replay)
    names = sorted(set(eager_k) | set(graph_k), key=lambda n: -max(eager_k.get(n, [0, 0])[1], graph_k.get(n, [0, 0])[1]))
    rows = [{"kernel": n[:160], "eager": [round(v, 1) for v in eager_k.get(n, [0, 0])],
             "graph": [round(v, 1) for v in graph_k.get(n, [0, 0])]} for n in names[:40]]
    print(json.dumps({"kind": label, "queued_ms": round(queued, 3), "replay_ms": round(replay, 3),
                      "eager_kernel_us": round(sum(v[1] for v in eager_k.values()), 1),
                      "graph_kernel_us": round(sum(v[1] for v in graph_k.values()), 1),
                      "eager_kernels": round(sum(v[0] for v in eager_k.values())),
                      "graph_kernels": round(sum(v[0] for v in graph_k.values())), "top": rows}), flush=True)


def moe_floors(device: torch.device) -> None:
    """calibrate's MoE block floor (one more tiny block's GPU time in a replayed decode step) at other counts of
    experts and choices than its tiny model's 8 and 2: does the floor grow with them?"""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    for experts, top_k in ((8, 2), (8, 8), (32, 8), (64, 8), (128, 2), (128, 8), (256, 8)):
        def make(layers: int) -> torch.nn.Module:
            return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=layers, num_experts=experts,
                                                      num_experts_per_tok=top_k, moe_intermediate_size=32,
                                                      decoder_sparse_step=1, mlp_only_layers=[], **c.TINY))
        ids = torch.zeros(1, 1, dtype=torch.long, device=device)

        def step_ms(model: torch.nn.Module) -> float:
            model = model.to(device, torch.bfloat16).eval()
            with torch.inference_mode():
                return c.graph_ms(lambda: model(ids, use_cache=False))

        times = c._by_depth(step_ms, make)
        print(json.dumps({"kind": "moe_floor", "experts": experts, "top_k": top_k,
                          "per_block_us": round(c._per_block_us(times), 2),
                          "times_ms": {str(k): round(v, 4) for k, v in times.items()}}), flush=True)


def moe_decode(device: torch.device) -> None:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    model, config = build("moe", Setup(False, "cuda"))
    ids = torch.randint(0, config.vocab_size, (1, 1), device=device)
    with torch.inference_mode():
        compare("moe_decode", lambda: model(ids, use_cache=False).logits)
    implementation = getattr(model.config, "_experts_implementation", None)
    del model
    torch.cuda.empty_cache()
    cfg = Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8)
    cfg._experts_implementation = implementation
    experts = Qwen3MoeExperts(cfg).to(device, torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    for tokens in (1, 8, 32):
        index = torch.stack([torch.randperm(128, generator=g)[:8] for _ in range(tokens)]).to(device)
        weights = torch.full((tokens, 8), 1 / 8, dtype=torch.bfloat16, device=device)
        x = torch.randn(tokens, 2048, dtype=torch.bfloat16, device=device)
        touched = len(set(index.flatten().tolist()))
        print(json.dumps({"kind": "experts_touched", "tokens": tokens, "touched": touched,
                          "implementation": implementation}), flush=True)
        with torch.inference_mode():
            compare(f"experts_{tokens}", lambda: experts(x, index, weights))


def decode_rows(device: torch.device) -> None:
    model, config = build("llama", Setup(False, "cuda"))
    for rows in (1, 32):
        ids = torch.randint(0, config.vocab_size, (rows, 1), device=device)
        with torch.inference_mode():
            compare(f"llama_decode_{rows}", lambda ids=ids: model(ids, use_cache=False).logits)


def main() -> int:
    device = torch.device("cuda")
    if "--decode-rows" in sys.argv[1:]:
        decode_rows(device)
        return 0
    if "--moe-decode" in sys.argv[1:]:
        moe_floors(device)
        moe_decode(device)
        return 0
    hidden, inter, heads, kv, hd = c.LLAMA_8B_BLOCK
    x = torch.randn(TOKENS, hidden, dtype=torch.bfloat16, device=device)
    w = torch.randn(inter, hidden, dtype=torch.bfloat16, device=device)
    compare("matmul_up", lambda: x @ w.T)
    q = torch.randn(1, heads, TOKENS, hd, dtype=torch.bfloat16, device=device)
    k = torch.randn(1, heads, TOKENS, hd, dtype=torch.bfloat16, device=device)
    compare("sdpa_causal", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True))
    del x, w, q, k
    model, config = build("llama", Setup(False, "cuda"))
    ids = torch.randint(0, config.vocab_size, (1, TOKENS), device=device)
    with torch.inference_mode():
        compare("llama_prefill", lambda: model(ids, use_cache=False).logits)
        compare("llama_prefill_no_head", lambda: model.model(ids, use_cache=False).last_hidden_state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
