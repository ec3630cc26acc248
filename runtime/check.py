"""Checking a plan against itself and against a model before anything moves.

The plan's own consistency is ``schemas.plan_check`` (run again here: a Plan built with
``model_construct`` or ``model_copy`` skipped validation); this module compares it with the model.
"""

from __future__ import annotations

from torch import nn

from runtime.dtensor import is_dtensor
from runtime.errors import PlanMismatchError
from runtime.tensors import dtype_name, resolve, split_owner, storage_nbytes
from runtime.ties import shared_storages, storage_key, within
from schemas import Plan


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return list(reversed(strides))


def check_model(plan: Plan, model: nn.Module) -> None:
    """Raise PlanMismatchError listing every difference between the plan and the model (the plan
    itself was checked first: runtime.plan_match.plan_problems)."""
    problems: list[str] = []
    shared = shared_storages(model)
    tie_targets = {owner for layer in plan.layers for owner in layer.tied.values()}
    for layer in plan.layers:
        try:
            model.get_submodule(layer.name)
        except AttributeError:
            problems.append(f"layer '{layer.name}' is not a submodule of the model")
            continue
        for rel, want in layer.params.items():
            if rel in layer.tied:  # the plan describes it by its owner; checked as a tie below
                continue
            ref = resolve(model, layer.name, rel)
            full = f"{layer.name}.{rel}"
            if ref is None:
                problems.append(f"'{full}' is not a param or buffer of the model")
                continue
            # a param the plan calls a buffer (or the reverse) moves the same way: not a mismatch,
            # and specs read from checkpoint headers cannot tell the two apart
            t = ref.local  # what moves: the param, or a DTensor param's local shard
            if t.device.type == "meta":
                problems.append(f"'{full}' is on the meta device (no data to offload)")
            if list(t.shape) != list(want.shape):
                problems.append(f"'{full}': shape {list(t.shape)} in the model, {want.shape} in the plan"
                                + sharded_hint(ref.get(), plan))
            if dtype_name(t.dtype) != want.dtype:
                problems.append(f"'{full}': dtype {dtype_name(t.dtype)} in the model, {want.dtype} in the plan")
            stride = want.stride or _contiguous_strides(want.shape)
            if list(t.shape) == list(want.shape) and t.numel() > 1 and list(t.stride()) != stride:
                if want.stride is not None or not t.is_contiguous():
                    problems.append(f"'{full}': stride {list(t.stride())} in the model, {stride} in the plan")
            elif storage_nbytes(t) != want.bytes and list(t.shape) == list(want.shape) \
                    and dtype_name(t.dtype) == want.dtype:
                problems.append(f"'{full}': {storage_nbytes(t)} bytes in the model, {want.bytes} in the plan")
        for rel, owner in layer.tied.items():
            full = f"{layer.name}.{rel}"
            ref = resolve(model, layer.name, rel)
            owner_layer, owner_rel = split_owner(plan, owner)
            oref = resolve(model, owner_layer, owner_rel) if owner_layer is not None else None
            if ref is None or oref is None:
                problems.append(f"tied '{full}' -> '{owner}': one of them is missing from the model")
                continue
            if ref.local is not oref.local and not within(ref.local, oref.local):
                problems.append(f"'{full}' is tied to '{owner}' by the plan but is not a view inside its storage "
                                f"in the model" if storage_key(ref.local) == storage_key(oref.local) else
                                f"'{full}' does not share storage with '{owner}' as the plan says")
        for rel in layer.offloaded:
            ref = resolve(model, layer.name, rel)
            full = f"{layer.name}.{rel}"
            if ref is not None and full in tie_targets:
                problems.append(f"'{full}' is offloaded but another param is tied to it")
            elif ref is not None and storage_key(ref.local) in shared:
                others = [n for n, t in shared[storage_key(ref.local)] if t is not ref.get()]
                problems.append(f"'{full}' is offloaded but shares its storage with {', '.join(map(repr, others[:3]))} "
                                f"(views of one tensor are tied, never offloaded: describe the model again)")
    if problems:
        raise PlanMismatchError(problems, plan.summary.model)


def sharded_hint(param, plan: Plan) -> str:
    """For a DTensor param whose local shard the plan does not describe: what to apply instead."""
    if not is_dtensor(param):
        return ""
    ranks = param.device_mesh.size()
    if plan.summary.world_size is None:
        return (f" (a DTensor split over {ranks} ranks, global shape {list(param.shape)}: a plan for the whole "
                f"model cannot run on one rank's shard; apply this rank's plan: planner plan --tp {ranks}, "
                f"rank{{r}}.plan.yaml)")
    return f" (this rank's shard of a DTensor of global shape {list(param.shape)} over {ranks} ranks)"


def meta_params(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.device.type == "meta"]

