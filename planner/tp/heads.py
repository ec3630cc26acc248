"""Attention under tensor parallel: q/k/v and o split by whole heads, as engines split them.

vLLM (QKVParallelLinear) gives each of ``tp`` ranks ``heads / tp`` query heads and, for keys and values,
``kv_heads / tp`` heads when ``tp <= kv_heads``; when ``tp > kv_heads`` it replicates each KV head over
``tp / kv_heads`` ranks, so every rank holds one whole KV head. No engine splits a head into pieces, nor
``heads`` over a ``tp`` that does not divide them, nor KV heads when neither of ``tp`` and ``kv_heads``
divides the other. The rows of these projections are heads x head_dim, so splitting rows evenly is
right only when it splits whole heads; with the spec's ``model.attention`` the split follows the heads.

Deciding only: the split of one param, or why no engine makes it (the caller words the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.spec import AttentionSpec

Q = frozenset({"q_proj", "wq", "query", "q_b_proj", "kv_b_proj"})  # MLA's kv_b_proj: per query head
KV = frozenset({"k_proj", "v_proj", "wk", "wv", "key", "value"})
FUSED = frozenset({"qkv_proj", "wqkv", "query_key_value"})
OUT = frozenset({"o_proj", "wo", "out_proj", "dense"})

NEEDS = ("add model.attention: {heads: H, kv_heads: K} to the spec (num_attention_heads and "
         "num_key_value_heads of the model's config.json)")


@dataclass(frozen=True)
class HeadSplit:
    shard: str  # dim0, dim1 or kv_head
    problem: str | None = None  # why no engine splits it so; None: fine


def module_of(rel: str) -> str:
    """The module holding a param (``self_attn.k_proj.weight`` -> ``k_proj``), lower case."""
    parts = rel.lower().split(".")
    return parts[-2] if len(parts) > 1 else ""


def head_split(module: str, shard: str, world_size: int, attention: AttentionSpec,
               shape: tuple[int, ...] | list[int]) -> HeadSplit:
    """The split of a default-ruled attention param of ``module`` (``shard``: the rule's; ``shape``: the
    whole param's) at ``world_size``."""
    heads, kv = attention.heads, attention.kv
    dim = 1 if shard == "dim1" else 0
    size = shape[dim] if len(shape) > dim else None
    count, what = (kv, "KV heads") if module in KV else (heads + 2 * kv, "q, k and v heads") if module in FUSED \
        else (heads, "heads")
    if size is not None and size % count:
        return HeadSplit(shard, f"its {size} {'rows' if dim == 0 else 'input features'} are no whole number of its "
                                f"{count} {what}")
    if module in Q or (module in OUT and shard == "dim1") or module in FUSED:
        if heads % world_size:
            return HeadSplit(shard, f"its {heads} attention heads do not split over {world_size} ranks "
                                    "(engines give each rank whole heads)")
    if module in KV or module in FUSED:
        if world_size <= kv and kv % world_size:
            return HeadSplit(shard, f"its {kv} KV heads do not split over {world_size} ranks (engines give each "
                                    "rank whole KV heads)")
        if world_size > kv and world_size % kv:
            return HeadSplit(shard, f"{world_size} ranks are no multiple of its {kv} KV heads, nor do they divide "
                                    "them: no engine splits or replicates KV heads so")
        if world_size > kv and module in FUSED:
            return HeadSplit(shard, f"a fused q/k/v projection at more ranks ({world_size}) than KV heads ({kv}) "
                                    "holds a replicated KV head beside its query heads, which this planner does not "
                                    "plan yet: list q_proj, k_proj and v_proj apart")
        if world_size > kv:
            return HeadSplit("kv_head")
    return HeadSplit(shard)
