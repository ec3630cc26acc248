"""A small Llama-style model of real nn.Modules, for runtime tests and benchmarks.

Random weights; the layout (names, shapes, execution order) follows Hugging Face's
Llama so plans written for it read like real ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    vocab: int = 512
    dim: int = 128
    layers: int = 16
    heads: int = 4
    kv_heads: int = 2
    hidden: int = 352
    tie_embeddings: bool = False


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        hd = c.dim // c.heads
        self.heads, self.kv_heads, self.hd = c.heads, c.kv_heads, hd
        self.q_proj = nn.Linear(c.dim, c.heads * hd, bias=False)
        self.k_proj = nn.Linear(c.dim, c.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(c.dim, c.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.heads * hd, c.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.dim, c.hidden, bias=False)
        self.up_proj = nn.Linear(c.dim, c.hidden, bias=False)
        self.down_proj = nn.Linear(c.hidden, c.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.dim)
        self.post_attention_layernorm = RMSNorm(c.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(ids))


def make_llama(c: LlamaConfig | None = None, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
               device: str = "cpu") -> Llama:
    torch.manual_seed(seed)
    c = c or LlamaConfig()
    with torch.device(device):
        model = Llama(c)
    for p in model.parameters():  # random, not the init's ones/zeros: a wrong weight must show
        with torch.no_grad():
            p.normal_(0, 0.05 if p.dim() > 1 else 1.0)
    return model.to(dtype).eval()
