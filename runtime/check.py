"""The one check of a plan against a model, before anything moves.

``check`` finds every tensor the plan names in the model once (a ``TensorRef`` each: what everything after it
uses) and collects, in one error, every reason the plan cannot run on this model:
- the plan object itself is invalid (a plan built with ``model_construct`` or edited in place skipped
  validation; ``schemas.plan_check`` is run again, as loading a plan file runs it);
- it was made from another spec (when the spec is at hand), or for another rank (runtime/this_rank.py);
- what it names differs from the model: a missing layer or tensor, a shape, dtype, stride or size, a tie that
  is no view of its owner's storage, an offloaded tensor that shares its storage, a DTensor layout;
- it names a tensor of the model twice (the same object, or views of one storage);
- it leaves params or persistent buffers of the model out (its memory accounting would not hold), or
  offloads registered buffers (runtime/writes.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import ValidationError
from torch import nn

from runtime.dtensor import is_dtensor, local_tensor
from runtime.errors import PlanMismatchError
from runtime.cpu_experts import split_problems
from runtime.this_rank import Rank, layout_problems, rank_problems
from runtime.tensors import TensorRef, dtype_name, resolve_in, storage_nbytes
from runtime.ties import shared_storages, storage_key, within
from runtime.writes import buffer_problems
from schemas.errors import InputError, Problem, problems_from_validation
from schemas.plan import DEFER_CHECK, Plan
from schemas.plan_check import check_plan
from schemas.sizes import format_bytes
from schemas.spec import SpecFile
from schemas.spec_hash import spec_sha256

Unplanned = Literal["refuse", "move"]
UNPLANNED_CHOICES = ("refuse", "move")

Refs = dict[tuple[str, str], TensorRef]  # (layer name, name in the layer) -> the tensor, for every name found


@dataclass(frozen=True)
class Loose:
    """A tensor of the model that the plan does not name."""

    ref: TensorRef  # layer "" and its full name in the model
    nbytes: int
    persistent: bool

    @property
    def name(self) -> str:
        return self.ref.rel


@dataclass(frozen=True)
class Checked:
    """What the check found: every param and tied name of the plan, resolved once, and what the plan leaves out."""

    refs: Refs
    loose: list[Loose]

    def ref(self, layer: str, rel: str) -> TensorRef:
        return self.refs[(layer, rel)]


def check(plan: Plan, model: nn.Module, *, unplanned: str, spec: SpecFile | None, loaded: bool, who: Rank,
          device: torch.device, read_only_buffers: bool) -> Checked:
    """Every reason the plan cannot run on this model, in one error; else what was found.

    ``loaded``: the plan was just loaded from a file (validated and checked already)."""
    invalid = [] if loaded else plan_problems(plan)
    if invalid:
        raise InputError(invalid)
    problems = spec_problems(plan, spec) + rank_problems(plan, who)
    refs, missing_layers = find(plan, model)
    problems += model_problems(plan, model, refs, missing_layers)
    problems += layout_problems(plan, refs, device) + split_problems(plan, model)
    problems += naming_problems(plan, refs)
    loose = loose_tensors(model, refs)
    offloaded = [refs[(layer.name, r)] for layer in plan.layers for r in layer.offloaded if (layer.name, r) in refs]
    problems += loose_problems(loose, unplanned) + buffer_problems(offloaded, read_only_buffers)
    if problems:
        raise PlanMismatchError(problems, plan.summary.model)
    return Checked(refs, loose)


def find(plan: Plan, model: nn.Module) -> tuple[Refs, list[str]]:
    """Every param and tied name of the plan as found in the model (each looked up once), and the plan's
    layers that are not submodules of the model."""
    refs: Refs = {}
    missing: list[str] = []
    for layer in plan.layers:
        try:
            module = model.get_submodule(layer.name)
        except AttributeError:
            missing.append(layer.name)
            continue
        for rel in (*layer.params, *layer.tied):
            ref = resolve_in(module, layer.name, rel)
            if ref is not None:
                refs[(layer.name, rel)] = ref
    return refs, missing


def plan_problems(plan: Plan) -> list[Problem]:
    """Problems of the plan object itself, found as loading a plan file finds them: a plan built
    with ``model_construct`` or edited in place skipped validation."""
    try:
        checked = Plan.model_validate(plan.model_dump(), context={DEFER_CHECK: True})
    except ValidationError as err:
        return problems_from_validation(err, source="the plan")
    except (AttributeError, TypeError) as exc:  # model_construct may leave fields out
        return [Problem(f"an incomplete plan object ({type(exc).__name__}: {exc})", "the plan")]
    try:
        check_plan(checked, source="the plan")
    except InputError as err:
        return err.problems
    return []


def spec_problems(plan: Plan, spec: SpecFile | None) -> list[str]:
    if spec is None:
        return []
    sha = spec_sha256(spec)
    if sha != plan.summary.spec_sha256:
        return [f"the plan was made from another spec (its spec_sha256 is {plan.summary.spec_sha256[:12]}…, "
                f"the given spec's is {sha[:12]}…); plan this spec again"]
    return []


def model_problems(plan: Plan, model: nn.Module, refs: Refs, missing_layers: list[str]) -> list[str]:
    """Every difference between what the plan says of each tensor and the model."""
    problems: list[str] = []
    shared = shared_storages(model)
    tie_targets = {owner for layer in plan.layers for owner in layer.tied.values()}
    owners = {f"{layer.name}.{rel}": refs[(layer.name, rel)] for layer in plan.layers  # a tie names its owner
              for rel in layer.params if rel not in layer.tied and (layer.name, rel) in refs}  # by its full name
    missing = set(missing_layers)
    for layer in plan.layers:
        if layer.name in missing:
            problems.append(f"layer '{layer.name}' is not a submodule of the model")
            continue
        for rel, want in layer.params.items():
            if rel in layer.tied:  # the plan describes it by its owner; checked as a tie below
                continue
            ref = refs.get((layer.name, rel))
            if ref is None:
                problems.append(f"'{layer.name}.{rel}' is not a param or buffer of the model")
                continue
            problems += _param_problems(ref, want, plan)
        for rel, owner in layer.tied.items():
            full = f"{layer.name}.{rel}"
            ref, oref = refs.get((layer.name, rel)), owners.get(owner)
            if ref is None or oref is None:
                problems.append(f"tied '{full}' -> '{owner}': one of them is missing from the model")
                continue
            if ref.local is not oref.local and not within(ref.local, oref.local):
                problems.append(f"'{full}' is tied to '{owner}' by the plan but is not a view inside its storage "
                                f"in the model" if storage_key(ref.local) == storage_key(oref.local) else
                                f"'{full}' does not share storage with '{owner}' as the plan says")
        for rel in layer.offloaded:
            ref = refs.get((layer.name, rel))
            full = f"{layer.name}.{rel}"
            if ref is not None and full in tie_targets:
                problems.append(f"'{full}' is offloaded but another param is tied to it")
            elif ref is not None and storage_key(ref.local) in shared:
                others = [n for n, t in shared[storage_key(ref.local)] if t is not ref.tensor]
                problems.append(f"'{full}' is offloaded but shares its storage with {', '.join(map(repr, others[:3]))} "
                                f"(views of one tensor are tied, never offloaded: describe the model again)")
    return problems


def _param_problems(ref: TensorRef, want, plan: Plan) -> list[str]:
    """How one param of the model differs from the plan's ``want`` (a PlanParam)."""
    # a param the plan calls a buffer (or the reverse) moves the same way: not a mismatch,
    # and specs read from checkpoint headers cannot tell the two apart
    problems = []
    full = ref.full
    t = ref.local  # what moves: the param, or a DTensor param's local shard
    if t.device.type == "meta":
        problems.append(f"'{full}' is on the meta device (no data to offload)")
    if list(t.shape) != list(want.shape):
        problems.append(f"'{full}': shape {list(t.shape)} in the model, {want.shape} in the plan"
                        + sharded_hint(ref.tensor, plan))
    if dtype_name(t.dtype) != want.dtype:
        problems.append(f"'{full}': dtype {dtype_name(t.dtype)} in the model, {want.dtype} in the plan")
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        problems.append(f"'{full}': an expanded view (stride {list(t.stride())}), whose elements share memory: "
                        "moving it needs a tensor of its own (p.data = p.data.contiguous() before describe and plan)")
    stride = want.stride or _contiguous_strides(want.shape)
    if list(t.shape) == list(want.shape) and t.numel() > 1 and list(t.stride()) != stride:
        if want.stride is not None or not t.is_contiguous():
            problems.append(f"'{full}': stride {list(t.stride())} in the model, {stride} in the plan")
    elif storage_nbytes(t) != want.bytes and list(t.shape) == list(want.shape) \
            and dtype_name(t.dtype) == want.dtype:
        problems.append(f"'{full}': {storage_nbytes(t)} bytes in the model, {want.bytes} in the plan")
    return problems


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return list(reversed(strides))


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


def naming_problems(plan: Plan, refs: Refs) -> list[str]:
    """Tensors of the model the plan names more than once as params (ties aside): the same object, or
    views of one storage (runtime/ties.py), whose bytes the plan would count twice."""
    problems: list[str] = []
    first: dict[tuple, tuple[str, torch.Tensor]] = {}  # storage -> the first name and tensor
    for layer in plan.layers:
        seen_off: set[str] = set()
        for rel in layer.offloaded:
            if rel in seen_off:
                problems.append(f"'{layer.name}.{rel}' is listed twice in the layer's offloaded params")
            seen_off.add(rel)
        for rel in layer.params:
            if rel in layer.tied:  # listed with its layer, stored at its owner
                continue
            ref = refs.get((layer.name, rel))
            if ref is None:
                continue  # model_problems reports it
            full, t = f"{layer.name}.{rel}", ref.tensor
            key = storage_key(t)
            if key in first:
                what = "the same tensor" if first[key][1] is t else "views of one storage"
                problems.append(f"'{full}' and '{first[key][0]}' are {what} of the model, named "
                                f"twice by the plan (list one, and the other under 'tied')")
            else:
                first[key] = (full, t)
    return problems


def loose_tensors(model: nn.Module, refs: Refs) -> list[Loose]:
    """Params and buffers of the model that the plan names neither as a param nor as tied."""
    seen = {id(ref.tensor) for ref in refs.values()}
    out = []
    for mname, module in model.named_modules():
        for is_buffer, store in ((False, module._parameters), (True, module._buffers)):
            for attr, t in store.items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                persistent = not (is_buffer and attr in module._non_persistent_buffers_set)
                ref = TensorRef("", f"{mname}.{attr}" if mname else attr, module, attr, is_buffer, t)
                out.append(Loose(ref, storage_nbytes(local_tensor(t)), persistent))
    return out


def loose_problems(loose: list[Loose], unplanned: str) -> list[str]:
    """With ``unplanned="refuse"``: every param or persistent buffer the plan does not name.
    Non-persistent buffers (rotary tables, masks) are never in a spec; they always move."""
    if unplanned == "move":
        return []
    named = [t for t in loose if t.persistent]
    if not named:
        return []
    total = sum(t.nbytes for t in named)
    shown = ", ".join(t.name for t in named[:8]) + (f" … and {len(named) - 8} more" if len(named) > 8 else "")
    return [f"{len(named)} params/buffers of the model ({format_bytes(total)}) are not in the plan, so its "
            f"memory promise would not hold: {shown}. Plan the whole model (runtime.describe(model)), or "
            f"pass unplanned='move' to put them on the device outside the plan's accounting"]


def meta_tensors(model: nn.Module) -> list[str]:
    """The params and buffers of the model on the meta device (no data to move)."""
    return [name for name, t in _named_tensors(model) if t.device.type == "meta"]


def _named_tensors(model: nn.Module):
    for mname, module in model.named_modules():
        for store in (module._parameters, module._buffers):
            for attr, t in store.items():
                if t is not None:
                    yield (f"{mname}.{attr}" if mname else attr), t
