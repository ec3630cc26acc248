"""Checking a plan against a model before anything moves."""

from __future__ import annotations

from torch import nn

from runtime.errors import PlanMismatchError
from runtime.tensors import dtype_name, resolve, split_owner, storage_nbytes
from schemas import Plan


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return list(reversed(strides))


def check_model(plan: Plan, model: nn.Module) -> None:
    """Raise PlanMismatchError listing every difference between the plan and the model."""
    problems: list[str] = []
    for layer in plan.layers:
        try:
            model.get_submodule(layer.name)
        except AttributeError:
            problems.append(f"layer '{layer.name}' is not a submodule of the model")
            continue
        for rel, want in layer.params.items():
            ref = resolve(model, layer.name, rel)
            full = f"{layer.name}.{rel}"
            if ref is None:
                problems.append(f"'{full}' is not a param or buffer of the model")
                continue
            # a param the plan calls a buffer (or the reverse) moves the same way: not a mismatch,
            # and specs read from checkpoint headers cannot tell the two apart
            t = ref.get()
            if t.device.type == "meta":
                problems.append(f"'{full}' is on the meta device (no data to offload)")
            if list(t.shape) != list(want.shape):
                problems.append(f"'{full}': shape {list(t.shape)} in the model, {want.shape} in the plan")
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
            a, b = ref.get(), oref.get()
            if a is not b and (a.device != b.device or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()):
                problems.append(f"'{full}' does not share storage with '{owner}' as the plan says")
        for rel in layer.offloaded:
            ref = resolve(model, layer.name, rel)
            if ref is not None and _is_tied_target(plan, f"{layer.name}.{rel}"):
                problems.append(f"'{layer.name}.{rel}' is offloaded but another param is tied to it")
    _check_summary(plan, problems)
    if problems:
        raise PlanMismatchError(problems, plan.summary.model)


def _is_tied_target(plan: Plan, full: str) -> bool:
    return any(owner == full for layer in plan.layers for owner in layer.tied.values())


def _check_summary(plan: Plan, problems: list[str]) -> None:
    s = plan.summary
    pool = plan.buffer_pool.bytes if plan.buffer_pool else 0
    if s.gpu_budget_bytes is not None and s.backend != "none":
        if pool > s.gpu_budget_bytes:
            problems.append(
                f"the buffer pool ({pool} bytes) is larger than the plan's GPU budget ({s.gpu_budget_bytes} bytes)"
            )
        elif s.peak_gpu_bytes > s.gpu_budget_bytes:
            problems.append(
                f"peak_gpu_bytes ({s.peak_gpu_bytes}) exceeds the plan's GPU budget ({s.gpu_budget_bytes})"
            )
    if s.backend == "prefetch" and plan.buffer_pool is not None:
        have = {(k.param, tuple(k.shape), k.dtype, tuple(k.stride or ())) : set(k.slots) for k in plan.buffer_pool.keys}
        for layer in plan.layers:
            if layer.prefetch is None:
                continue
            for rel in layer.offloaded:
                p = layer.params[rel]
                key = (rel, tuple(p.shape), p.dtype, tuple(p.stride or ()))
                if layer.prefetch.slot not in have.get(key, set()):
                    problems.append(
                        f"'{layer.name}.{rel}' needs slot {layer.prefetch.slot} of buffer key "
                        f"{rel} {p.shape} {p.dtype}, which the buffer pool lacks"
                    )


def meta_params(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.device.type == "meta"]

