"""A tiny tensor-parallel Llama and its rank plans, for the tensor-parallel runtime tests and bench.

``parallelize`` shards tests/models.py's Llama with ``torch.distributed.tensor.parallel``: q/k/v,
gate and up column-parallel, o and down row-parallel, the embedding split by vocabulary rows, the
lm_head column-parallel with its output gathered; norms stay whole on every rank.

``rank_plans`` makes one plan per rank from the model's global spec (``planner.plan_ranks``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

import planner
from schemas import Plan, SpecFile


def parallelize(model: nn.Module, mesh, blocks: str = "model.layers", vocab: bool = True) -> nn.Module:
    """Shard a Llama-style model over the 1-D ``mesh`` in place (names as in Hugging Face's Llama);
    ``vocab=False`` leaves the embedding and the lm_head whole on every rank."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    ranks = mesh.size()
    for block in model.get_submodule(blocks):
        parallelize_module(block, mesh, {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()})
        attn = block.self_attn
        for attr in ("heads", "kv_heads", "num_heads", "num_key_value_heads"):  # this rank's heads
            if isinstance(getattr(attn, attr, None), int):
                setattr(attn, attr, getattr(attn, attr) // ranks)
    if vocab:
        parallelize_module(model, mesh, {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Replicate())})
    return model


def rank_plans(spec: SpecFile, world_size: int, **plan_kwargs: Any) -> list[Plan]:
    """One plan per rank (index = rank) for the global ``spec`` (shards from runtime.describe)."""
    return planner.plan_ranks(spec, world_size, **plan_kwargs)


def replicated(spec: SpecFile) -> SpecFile:
    """``spec`` with every param marked ``shard: replicated`` (a plain model run whole on every rank)."""
    data: dict[str, Any] = spec.model_dump(mode="json", exclude_none=True)
    for layer in data["model"]["layers"]:
        for p in layer.get("params", {}).values():
            p["shard"] = "replicated"
    return SpecFile.model_validate(data)
