"""A tiny tensor-parallel Llama and its rank plans, for the tensor-parallel runtime tests and bench.

``parallelize`` shards tests/models.py's Llama with ``torch.distributed.tensor.parallel``: q/k/v,
gate and up column-parallel, o and down row-parallel, the embedding split by vocabulary rows, the
lm_head column-parallel with its output gathered; norms stay whole on every rank.

``rank_plans`` makes one plan per rank from the model's global spec, as ``planner.plan_ranks`` does
(used when present): each param's local shape from its ``shard``, planned, then marked with its rank.
"""

from __future__ import annotations

from typing import Any

from torch import nn

import planner
from schemas import Plan, SpecFile
from schemas.shard import local_shape
from schemas.spec_hash import spec_sha256


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


def local_spec(spec: SpecFile, world_size: int) -> SpecFile:
    """The spec of one rank's part: each param's shape split as its ``shard`` says, no shards."""
    data: dict[str, Any] = spec.model_dump(mode="json", exclude_none=True)
    for layer in data["model"]["layers"]:
        for p in layer.get("params", {}).values():
            p["shape"] = list(local_shape(p["shape"], p.pop("shard", "replicated"), world_size))
    return SpecFile.model_validate(data)


def rank_plans(spec: SpecFile, world_size: int, **plan_kwargs: Any) -> list[Plan]:
    """One plan per rank (index = rank) for the global ``spec`` (shards from runtime.describe)."""
    plan_ranks = getattr(planner, "plan_ranks", None)
    if plan_ranks is not None:
        return plan_ranks(spec, world_size, **plan_kwargs)
    shards = {}
    for layer in spec.model.layers:  # a template's params hold for each layer it expands to
        names = [layer.name.replace("{i}", str(layer.start + k)) for k in range(layer.repeat or 1)]
        shards.update({f"{name}.{rel}": p.shard for name in names for rel, p in layer.params.items()})
    base = planner.plan(local_spec(spec, world_size), **plan_kwargs).model_dump()
    base["summary"]["spec_sha256"] = spec_sha256(spec)
    for layer in base["layers"]:
        for rel, p in layer["params"].items():
            p["shard"] = shards[f"{layer['name']}.{rel}"] or "replicated"
    plans = []
    for rank in range(world_size):
        base["summary"].update(rank=rank, world_size=world_size)
        plans.append(Plan.model_validate(base))
    return plans
