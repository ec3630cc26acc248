"""A gpt-fast-style decoder whose KV cache is a registered (persistent) buffer written in forward.

Each block's ``attention.kv_cache`` holds ``k_cache``/``v_cache`` buffers that the forward
writes in place at ``input_pos`` (``self.k_cache[:, :, pos] = k``), as gpt-fast's ``KVCache``
does. Offloading such a buffer would lose the writes; the runtime refuses (runtime/writes.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class KVCache(nn.Module):
    def __init__(self, batch: int, heads: int, max_len: int, head_dim: int) -> None:
        super().__init__()
        shape = (batch, heads, max_len, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def update(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k_cache[:, :, pos] = k
        self.v_cache[:, :, pos] = v
        return self.k_cache, self.v_cache


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, batch: int, max_len: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.kv_cache = KVCache(batch, heads, max_len, self.hd)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, self.hd).transpose(1, 2) for y in self.wqkv(x).split(d, dim=-1))
        k, v = self.kv_cache.update(pos, k, v)
        y = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, batch: int, max_len: int) -> None:
        super().__init__()
        self.attention = Attention(dim, heads, batch, max_len)
        self.feed_forward = nn.Sequential(nn.Linear(dim, 2 * dim, bias=False), nn.SiLU(),
                                          nn.Linear(2 * dim, dim, bias=False))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x, pos, mask)
        return x + self.feed_forward(x)


class KVDecoder(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 4, batch: int = 1,
                 max_len: int = 16) -> None:
        super().__init__()
        self.max_len = max_len
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, batch, max_len) for _ in range(layers))
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(self.max_len, self.max_len, dtype=torch.bool, device=ids.device).tril()[pos][None, None]
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x, pos, mask)
        return self.output(x)


def make_kv_decoder(seed: int = 0, device: str = "cpu", **kwargs) -> KVDecoder:
    torch.manual_seed(seed)
    model = KVDecoder(**kwargs)  # built on the CPU: the same weights whatever the device (CUDA's RNG differs)
    return model.to(device).eval()


def generate(model: nn.Module, prompt: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Greedy decoding as gpt-fast does it: a prefill, then one token a forward; every step's logits."""
    device = prompt.device
    logits = []
    with torch.no_grad():
        out = model(prompt, torch.arange(prompt.shape[1], device=device))
        logits.append(out[:, -1])
        pos = prompt.shape[1]
        for _ in range(steps):
            nxt = out[:, -1].argmax(-1, keepdim=True)
            out = model(nxt, torch.tensor([pos], device=device))
            logits.append(out[:, -1])
            pos += 1
    return logits
