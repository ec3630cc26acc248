"""What refuses to run on an applied model, and what keeps ``state_dict()`` truthful.

While a plan is applied, a param's ``.data`` is its compute copy (a prefetch slot shared
with other layers, a UVA view of pinned memory, or an empty placeholder), and its true
value is the host copy the placement holds. So, on every module of the applied tree:

- ``_apply`` (behind ``.to/.half/.float/.bfloat16/.double/.cuda/.cpu/.type/.to_empty/
  .share_memory``), ``copy.copy``/``copy.deepcopy`` and pickling (``torch.save(model)``)
  raise ``AppliedModelError`` before anything changes;
- ``load_state_dict`` raises before any value is copied;
- ``state_dict()`` returns the true values: offloaded tensors as fresh host copies;
  ``state_dict(keep_vars=True)`` raises (it would hand out params holding slot contents).

The refusals are instance attributes and hooks; ``remove()`` deletes them, leaving each
module's ``__dict__`` and hook tables as they were (its class is never changed).
The refusing attribute holds the handle, so a model keeps its handle alive.

And torch.compile: dynamo does not guard on ``nn.Module`` hooks by default (``torch._dynamo.config.
skip_nnmodule_hook_guards``), so code compiled for one instance of a model class (an unoffloaded copy used
as a reference, say) is reused for an instance that carries offload hooks: it runs without them and reads
slot buffers that hold another layer's weights. The outputs are silently wrong (measured: bf16 logits off
by 3.3 on a prefetch plan). So while any plan is applied, dynamo guards on hooks (``hold_hook_guards``),
and the previous setting comes back when the last plan is removed. ``apply`` and ``remove`` also call
``torch._dynamo.reset()`` (``reset_compiled_code``), so code compiled for this model before ``apply`` (or
while it was applied) is never reused for the other state. That reset is process-wide: it drops the
compiled code of every model in the process, not only this one's (docs/DESIGN.md, "torch.compile").
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from runtime.errors import ApplyError

log = logging.getLogger("runtime")

# instance attributes that shadow nn.Module / object methods while applied
_REFUSED = {
    "_apply": "change the dtype or device of a module (.to, .half, .float, .bfloat16, .cuda, .cpu, ...)",
    "__deepcopy__": "copy a module (copy.deepcopy)",
    "__reduce_ex__": "copy or pickle a module (copy.copy, pickle, torch.save(model))",
}
_ABSENT = object()


class AppliedModelError(ApplyError):
    """A call that would change or copy a model while a plan is applied to it. Nothing changed."""

    def __init__(self, message: str, handle: object) -> None:
        super().__init__(message)
        self.handle = handle


def _refusal(handle: object, what: str, module_name: str) -> str:
    where = f"'{module_name}' is part of a model" if module_name else "the model is"
    return (f"cannot {what}: {where} offloaded by {handle!r}; "
            f"call handle.remove() first (runtime.handle_of(model) finds the handle)")


class _Refuse:
    """Stands in for a module method while applied; calling it raises."""

    def __init__(self, handle: object, what: str, module_name: str) -> None:
        self.handle, self.what, self.module_name = handle, what, module_name

    def __call__(self, *args, **kwargs):
        raise AppliedModelError(_refusal(self.handle, self.what, self.module_name), self.handle)


def handle_of(module: nn.Module) -> object | None:
    """The handle of the plan applied to ``module`` (or to a model containing it), else None."""
    guard = module.__dict__.get("_apply")
    return guard.handle if isinstance(guard, _Refuse) else None


def refuse_if_applied(model: nn.Module) -> None:
    """Raise when ``model``, one of its submodules, or a model containing it is already applied."""
    for name, module in model.named_modules():
        guard = module.__dict__.get("_apply")
        if not isinstance(guard, _Refuse):
            continue
        if name:
            where = f"its submodule '{name}' is"
        elif guard.module_name:
            where = f"it is the submodule '{guard.module_name}' of a model"
        else:
            where = "it is"
        raise AppliedModelError(f"cannot apply a plan to this model: {where} already offloaded by "
                                f"{guard.handle!r}; call that handle's remove() first", guard.handle)


@dataclass(eq=False)
class Guards:
    """The refusals and hooks installed on one applied model; ``remove()`` takes them all off."""

    hooks: list[RemovableHandle] = field(default_factory=list)
    shadowed: list[tuple[nn.Module, str, object]] = field(default_factory=list)  # (module, attr, previous)

    def remove(self) -> None:
        while self.hooks:
            self.hooks.pop().remove()
        while self.shadowed:
            module, attr, previous = self.shadowed.pop()
            if previous is _ABSENT:
                module.__dict__.pop(attr, None)
            else:
                module.__dict__[attr] = previous


def install(handle: object, model: nn.Module, true_values: dict[int, torch.Tensor | Callable[[], torch.Tensor]]) -> Guards:
    """Guard every module of ``model``. ``true_values`` maps id(param or buffer object) to the
    tensor holding its true value (the host copy) for every tensor whose ``.data`` is not it, or to a
    function returning a fresh copy of it (a param split by expert, runtime/cpu_experts.py).
    On failure, whatever was installed is taken off again."""
    guards = Guards()
    try:
        for name, module in model.named_modules():
            for attr, what in _REFUSED.items():
                guards.shadowed.append((module, attr, module.__dict__.get(attr, _ABSENT)))
                module.__dict__[attr] = _Refuse(handle, what, name)
            guards.hooks.append(module.register_load_state_dict_pre_hook(_refuse_load(handle, name)))
            held = _held(module, true_values)
            if held:
                guards.hooks.append(module.register_state_dict_pre_hook(_refuse_keep_vars(handle, name)))
                guards.hooks.append(_register_state_dict_post_hook(module, _true_state(held)))
    except BaseException:
        guards.remove()
        raise
    return guards


def _held(module: nn.Module, true_values: dict[int, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    out = []
    for store in (module._parameters, module._buffers):
        for attr, t in store.items():
            if t is not None and id(t) in true_values:
                out.append((attr, true_values[id(t)]))
    return out


def _refuse_load(handle: object, name: str):
    def hook(module, state_dict, prefix, *rest):
        raise AppliedModelError(_refusal(handle, "load a state dict into a module", name), handle)

    return hook


def _refuse_keep_vars(handle: object, name: str):
    def hook(module, prefix, keep_vars):
        if keep_vars:
            raise AppliedModelError(_refusal(
                handle, "hand out params with state_dict(keep_vars=True): offloaded params hold "
                "their compute copies, not their values (state_dict() returns the true values)", name), handle)

    return hook


def _true_state(held: list[tuple[str, torch.Tensor]]):
    def hook(module, state_dict, prefix, local_metadata):
        for attr, value in held:
            key = prefix + attr
            if key in state_dict:
                state_dict[key] = value() if callable(value) else value.detach().clone()

    return hook


def _register_state_dict_post_hook(module: nn.Module, hook) -> RemovableHandle:
    public = getattr(module, "register_state_dict_post_hook", None)  # torch >= 2.5
    if public is not None:
        return public(hook)

    def legacy(module, state_dict, prefix, local_metadata):
        hook(module, state_dict, prefix, local_metadata)
        return None

    return module._register_state_dict_hook(legacy)


# ---------------------------------------------------------------------------
# torch.compile: dynamo guards on module hooks while any plan is applied

_hook_guard_holds = 0
_saved_skip: bool | None = None


def hold_hook_guards() -> None:
    """One more applied plan: make dynamo guard on module hooks."""
    global _hook_guard_holds, _saved_skip
    import torch._dynamo.config as config

    if _hook_guard_holds == 0:
        _saved_skip = config.skip_nnmodule_hook_guards
        config.skip_nnmodule_hook_guards = False
    _hook_guard_holds += 1


def release_hook_guards() -> None:
    """One plan fewer: the last one restores dynamo's own setting."""
    global _hook_guard_holds
    if _hook_guard_holds == 0:
        return
    _hook_guard_holds -= 1
    if _hook_guard_holds == 0:
        import torch._dynamo.config as config

        config.skip_nnmodule_hook_guards = _saved_skip


def reset_compiled_code() -> None:
    """Drop code compiled before apply() (or remove()): it was traced without (or with) the hooks. This is
    ``torch._dynamo.reset()``, which drops every compiled function of the process (a no-op before dynamo loads)."""
    if "torch._dynamo" in sys.modules:
        import torch._dynamo

        torch._dynamo.reset()
        log.info("torch.compile caches reset so compiled code sees the offload hooks")
