"""Why a 2,048-token prefill replayed as one CUDA graph is slower than its kernels queued eagerly (issue 19).

    PYTHONPATH=. python bench/probe_replay_kernels.py > $OUT/replay-kernels.jsonl     # the H200

On 2026-12-02 ``bench/probe_block_stack.py`` measured the Llama-3-8B shape's resident prefill of 2,048 tokens
at 60.48 ms queued (the CPU issues the whole forward while the stream sleeps, so the kernels run back to back)
and 67.90 ms replayed as one CUDA graph. Here, in one process: both timings again, then the CUDA kernels of one
queued forward and of one replay under torch.profiler, summed by kernel name (count and GPU microseconds), so
that a kernel chosen differently under capture (cuBLAS's algorithm, SDPA's backend) or a kernel slower under
capture shows by name; and the same for a single matmul and a single SDPA call of the shape's sizes."""
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


def main() -> int:
    device = torch.device("cuda")
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
