"""The block GPU floor and attention's read of a KV cache in CUDA graph replay, on the H200 (issues 19, 20).

    PYTHONPATH=. python bench/probe_graph_floor.py --out $OUT/floor.jsonl

One JSON line per figure: ``runtime.calibrate.block_gpu_floor`` (tiny Llama and Qwen3-MoE decode steps replayed
as CUDA graphs: the GPU time one more block adds), the same timed queued instead of replayed, and scaled
dot-product attention at a decode step over a 4,096-token cache (Phi-3-mini's shape: 32 heads of 96, no grouped
heads; and Llama's: 32 query heads over 8 KV heads, ``enable_gqa``) at batch 8 and 32, replayed: the cache's
bytes / the time (the rate the cost model reads a cache at is ``gpu_mem_gbps``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from runtime.calibrate import block_gpu_floor, gpu_ms, graph_ms  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    rows = [{"figure": "graph", **block_gpu_floor(device)},
            {"figure": "queued", **block_gpu_floor(device, timer=lambda fn: gpu_ms(fn, queued=True))}]
    for name, heads, kv_heads, dim in (("phi3", 32, 32, 96), ("llama", 32, 8, 128)):
        for batch in (8, 32):
            q = torch.randn(batch, heads, 1, dim, dtype=torch.bfloat16, device=device)
            k, v = (torch.randn(batch, kv_heads, 4096, dim, dtype=torch.bfloat16, device=device) for _ in range(2))
            with torch.inference_mode():
                ms = graph_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, enable_gqa=kv_heads != heads))
            nbytes = 2 * k.numel() * k.element_size()
            rows.append({"figure": "sdpa_decode", "shape": name, "batch": batch, "ms": round(ms, 4),
                         "cache_bytes": nbytes, "gbps": round(nbytes / ms / 1e6, 1)})
            del q, k, v
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for row in rows:
            print(json.dumps(row), flush=True)
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
