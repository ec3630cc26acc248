"""Checks that the plan covers this model, once each, before anything moves.

``check_model`` compares what the plan names with the model; these checks add what it
cannot see from the plan side: that the plan object is itself valid (a plan built with
``model_construct`` or edited in place skipped validation), that no tensor of the model
is named twice, that every param and persistent buffer of the model is named (otherwise
the plan's memory accounting does not hold), that no tensor is on the meta device, and,
when the spec is at hand, that the plan was made from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import ValidationError
from torch import nn

from runtime.dtensor import local_tensor
from runtime.tensors import resolve, storage_nbytes
from runtime.ties import storage_key
from schemas import Plan, SpecFile, format_bytes
from schemas.errors import InputError, Problem, problems_from_validation
from schemas.plan import DEFER_CHECK
from schemas.plan_check import check_plan
from schemas.spec_hash import spec_sha256

Unplanned = Literal["refuse", "move"]
UNPLANNED_CHOICES = ("refuse", "move")


@dataclass(frozen=True)
class Loose:
    """A tensor of the model that the plan does not name."""

    name: str
    module: nn.Module
    attr: str
    is_buffer: bool
    nbytes: int
    persistent: bool


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


def meta_tensors(model: nn.Module) -> list[str]:
    return [name for name, t in _named_tensors(model) if t.device.type == "meta"]


def naming_problems(plan: Plan, model: nn.Module) -> list[str]:
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
            full = f"{layer.name}.{rel}"
            t = _get(model, layer.name, rel)
            if t is None:
                continue  # check_model reports it
            key = storage_key(t)
            if key in first:
                what = "the same tensor" if first[key][1] is t else "views of one storage"
                problems.append(f"'{full}' and '{first[key][0]}' are {what} of the model, named "
                                f"twice by the plan (list one, and the other under 'tied')")
            else:
                first[key] = (full, t)
    return problems


def loose_tensors(plan: Plan, model: nn.Module) -> list[Loose]:
    """Params and buffers of the model that the plan names neither as a param nor as tied."""
    named: set[int] = set()
    for layer in plan.layers:
        for rel in list(layer.params) + list(layer.tied):
            t = _get(model, layer.name, rel)
            if t is not None:
                named.add(id(t))
    out, seen = [], set(named)
    for mname, module in model.named_modules():
        for is_buffer, store in ((False, module._parameters), (True, module._buffers)):
            for attr, t in store.items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                persistent = not (is_buffer and attr in module._non_persistent_buffers_set)
                out.append(Loose(f"{mname}.{attr}" if mname else attr, module, attr, is_buffer,
                                 storage_nbytes(local_tensor(t)), persistent))
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


def _get(model: nn.Module, layer: str, rel: str) -> torch.Tensor | None:
    ref = resolve(model, layer, rel)
    return None if ref is None else ref.get()


def _named_tensors(model: nn.Module):
    for mname, module in model.named_modules():
        for store in (module._parameters, module._buffers):
            for attr, t in store.items():
                if t is not None:
                    yield (f"{mname}.{attr}" if mname else attr), t
