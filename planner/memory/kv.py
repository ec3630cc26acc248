"""The KV cache's size: the bytes one token of context takes, over every attention layer.

A layer caches, per token, what its key and value projections output (``k_proj`` and ``v_proj`` widths:
grouped-query attention caches fewer heads than it queries), in the cache's dtype (``memory.kv_cache_dtype``,
default the model's activations' dtype). A fused ``qkv_proj`` is split by the spec's ``model.attention``
heads; DeepSeek's latent attention is cached as transformers caches it, keys and values expanded per head,
which needs the number of heads too. Where the spec cannot say, ``memory.kv_bytes_per_token`` does (a
sliding-window model, another engine's latent cache), and without it a forward that keeps a KV cache is
refused with the reason (``KvSize.problem``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.memory.shapes import LayerShape

NEEDS_HEADS = "add model.attention: {heads: H, kv_heads: K} (num_attention_heads and num_key_value_heads of its config)"


@dataclass(frozen=True)
class KvSize:
    per_token: int | None  # bytes a token of context takes, all layers (None: not known, see problem)
    layers: tuple[int, ...]  # the positions of the layers that cache keys and values
    widest: int  # the widest key or value of one layer, bytes per token (a dynamic cache copies it as it grows)
    problem: str | None = None  # why per_token is not known
    given: bool = False  # memory.kv_bytes_per_token


def kv_size(shapes: Sequence[LayerShape], itemsize: int, given: int | None = None) -> KvSize:
    """The KV cache's size per token of ``shapes`` in a cache of ``itemsize`` bytes an element; ``given``:
    memory.kv_bytes_per_token, which replaces the shapes' figure."""
    layers, total, widest, problems = [], 0, 0, []
    for i, s in enumerate(shapes):
        a = s.attention
        if a is None:
            if s.attention_params and not s.block:
                problems.append(f"{s.name}: its attention params ({', '.join(s.attention_params[:3])}) are not "
                                "projections this planner recognizes")
            continue
        if a.k is None or a.v is None:
            what = ("DeepSeek-style latent attention (kv_a_proj_with_mqa, kv_b_proj), cached per head by "
                    "transformers" if a.latent else "queries, keys and values in one projection")
            problems.append(f"{s.name}: {what}: sizing its cache needs the number of heads; {NEEDS_HEADS}")
            continue
        layers.append(i)
        total += (a.k + a.v) * itemsize
        widest = max(widest, a.k * itemsize, a.v * itemsize)
    if given is not None:
        return KvSize(given, tuple(layers), max(widest, given // max(len(layers), 1) // 2), given=True)
    if problems:
        more = f" (and {len(problems) - 1} more layers)" if len(problems) > 1 else ""
        return KvSize(None, tuple(layers), widest, problems[0] + more + ", or give memory.kv_bytes_per_token")
    return KvSize(total, tuple(layers), widest)
