"""A decoder block timed alone and in a stack, against the whole model's prefill (issue 19).

    PYTHONPATH=. python bench/probe_block_stack.py > $OUT/block-stack.jsonl     # the H200

Why: the Llama-3-8B shape's resident prefill of 2,048 tokens measured 67.7 ms in CUDA graph replay on
2026-12-02 (bench/results/predict-h200-2026-12-02e/) where the prediction from that run's ``planner calibrate``
gave 60.8 (0.90): calibrate times one decoder block (queued behind a GPU sleep, ``block_compute``) and fits
``attention_tflops`` and ``elementwise_bytes`` to it. Here, on one GPU in one process: that block timed as
calibrate does; the same block timed 32 times back to back (the GPU busy as long as a whole forward: clocks
and power as in the model's prefill); each of its matrices' matmuls at 2,048 tokens against calibrate's
square matmul rate; and the resident model's prefill, queued (behind a GPU sleep long enough for the CPU to
issue it) and in graph replay."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_memory import Setup, build  # noqa: E402
from runtime import calibrate as c  # noqa: E402

STACK = 32
SLEEP = 400_000_000  # GPU cycles (about 0.2 s) the stream is held while the CPU issues a whole stack


def stacked_ms(fn, n: int = STACK, repeat: int = 5) -> float:
    """ms of one ``fn()`` among ``n`` run back to back, queued behind a GPU sleep (CUDA events, median)."""
    times = []
    for i in range(repeat + 1):
        torch.cuda._sleep(SLEEP)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        if i:
            times.append(a.elapsed_time(b) / n)
    return statistics.median(times)


def main() -> int:
    device = torch.device("cuda")
    m = c.matmuls(device)
    tflops, mem = float(m["matmul_tflops"]), float(m["gpu_mem_gbps"])
    print(json.dumps({"kind": "matmul", "matmul_tflops": tflops, "gpu_mem_gbps": mem}), flush=True)
    single = c.block_compute(device, tflops, mem)
    stack = c.block_compute(device, tflops, mem, timer=stacked_ms)
    print(json.dumps({"kind": "block", "single": single, "stacked": stack}), flush=True)
    hidden, inter, heads, kv, hd = c.LLAMA_8B_BLOCK
    tokens = 2048
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)
    rows = []
    for r, k in [(heads * hd, hidden), (kv * hd, hidden), (hidden, heads * hd), (inter, hidden), (hidden, inter)]:
        w = torch.randn(r, k, dtype=torch.bfloat16, device=device)
        a = x if k == hidden else torch.randn(tokens, k, dtype=torch.bfloat16, device=device)
        ms = c.gpu_ms(lambda a=a, w=w: a @ w.T, queued=True)
        ms_stacked = stacked_ms(lambda a=a, w=w: a @ w.T)
        rows.append({"shape": [r, k], "ms": ms, "ms_stacked": ms_stacked, "tflops": 2 * tokens * r * k / ms / 1e9,
                     "tflops_stacked": 2 * tokens * r * k / ms_stacked / 1e9})
    print(json.dumps({"kind": "matrices", "tokens": tokens, "rows": rows}), flush=True)
    del x
    model, config = build("llama", Setup(False, "cuda"))
    ids = torch.randint(0, config.vocab_size, (1, tokens), device=device)
    with torch.inference_mode():
        def forward():
            return model(ids, use_cache=False).logits
        queued = stacked_ms(forward, n=1)
        replay = c.graph_ms(forward, repeat=5)
    print(json.dumps({"kind": "model", "tokens": tokens, "prefill_queued_ms": queued,
                      "prefill_graph_ms": replay}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
