"""How a tensor-parallel model splits a param across ranks, defined once for the spec, the plan and the runtime.

- ``replicated``: every rank holds the whole param (norms, routers, biases of row-parallel layers).
- ``dim0``: column parallel: the output features (dim 0 of a Linear weight) are split in equal contiguous
  parts, rank r holding part r (q/k/v, gate, up).
- ``dim1``: row parallel: the input features (dim 1) are split (o, down); the layer's output is all-reduced.
- ``vocab``: an embedding or lm_head split by vocabulary rows (dim 0).
- ``experts``: stacked routed experts ``[experts, ...]`` split by expert (dim 0), each rank holding
  ``experts / world_size`` whole experts.
- ``kv_head``: a k or v projection at more ranks than KV heads (vLLM's rule): rank r holds one whole KV head
  (dim 0 holds the heads), KV head ``r * kv_heads // world_size``, each head replicated over
  ``world_size / kv_heads`` ranks. torch's ColwiseParallel has no such layout (it would cut the heads),
  so the runtime applies these plans to no DTensor model; they describe engines that replicate KV heads.

A split dimension must divide evenly by the world size, as ``torch.distributed.tensor`` requires for the
layouts this project plans (uneven shards are refused, not guessed).
"""

from __future__ import annotations

from typing import Literal, get_args

Shard = Literal["replicated", "dim0", "dim1", "vocab", "experts", "kv_head"]
SHARDS: tuple[str, ...] = get_args(Shard)

SPLIT_DIM: dict[str, int | None] = {"replicated": None, "dim0": 0, "dim1": 1, "vocab": 0, "experts": 0, "kv_head": 0}


def split_dim(shard: str) -> int | None:
    """The dimension ``shard`` splits, or None when every rank holds the whole param."""
    return SPLIT_DIM[shard]


def local_shape(shape: tuple[int, ...] | list[int], shard: str, world_size: int,
                kv_heads: int | None = None) -> tuple[int, ...]:
    """The shape of one rank's part of a param of ``shape`` (``kv_heads``: the model's, for ``kv_head``);
    ValueError when it does not split evenly."""
    dim = split_dim(shard)
    out = tuple(shape)
    if dim is None or world_size == 1:
        return out
    if shard == "kv_head":
        if kv_heads is None or not out or world_size % kv_heads or out[0] % kv_heads:
            raise ValueError(f"shard 'kv_head' needs the KV heads to divide the world size {world_size} and "
                             f"dim 0 (shape {list(out)}); KV heads: {kv_heads}")
        return (out[0] // kv_heads,) + out[1:]
    if dim >= len(out):
        raise ValueError(f"shard {shard!r} splits dim {dim} but the param has {len(out)} dims (shape {list(out)})")
    if out[dim] % world_size:
        raise ValueError(f"shard {shard!r} splits dim {dim} of size {out[dim]}, "
                         f"which does not divide by the world size {world_size}")
    return out[:dim] + (out[dim] // world_size,) + out[dim + 1:]
