"""The GPU bytes library workspaces take on a stream a forward runs on (``workspace_bytes``)."""

from __future__ import annotations

import torch


def workspace(device: torch.device) -> dict[str, int]:
    """The GPU bytes library workspaces take on a stream a forward runs on: what stays allocated after a
    bf16 matmul and an SDPA attention on a fresh stream, less their outputs (cuBLAS keeps a workspace per
    stream it has run on, allocated through PyTorch's caching allocator, so ``max_memory_allocated`` sees it)."""
    torch.cuda.synchronize(device)
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        a = torch.randn(256, 4096, device=device, dtype=torch.bfloat16)
        w = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        q = torch.randn(1, 8, 256, 128, device=device, dtype=torch.bfloat16)
        stream.synchronize()
        before = torch.cuda.memory_allocated(device)
        y = a @ w.T
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        stream.synchronize()
        after = torch.cuda.memory_allocated(device)
    kept = after - before - y.untyped_storage().nbytes() - o.untyped_storage().nbytes()
    return {"workspace_bytes": max(0, kept)}
