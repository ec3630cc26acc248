"""``apply(plan, model)``: execute an offload plan on a real module; ``Handle.remove()`` undoes it."""

from __future__ import annotations

import logging
import weakref
from pathlib import Path

import torch
from torch import nn

from runtime.check import check_model, meta_params
from runtime.errors import ApplyError
from runtime.offloader import Offloaded, Offloader, make_offloader
from runtime.placement import Placement
from runtime.progress import Progress
from runtime.tensors import TensorRef, plan_refs, resolve, split_owner
from schemas import Plan, format_bytes, load_plan

log = logging.getLogger("runtime")

_ACTIVE: dict[int, Handle] = {}


class Handle:
    """What ``apply`` returns: ``remove()`` (or leaving a ``with`` block) restores the model."""

    def __init__(self, plan: Plan, model: nn.Module, offloader: Offloader, placement: Placement) -> None:
        self.plan, self.model, self.offloader = plan, model, offloader
        self._placement = placement
        self.active = True
        # the model keeps its handle alive: host memory is never released (unpinned) while
        # params still point at it, even if the caller drops the handle without remove()
        _ACTIVE[id(self)] = self
        self._finalizer = weakref.finalize(model, _ACTIVE.pop, id(self), None)

    def stats(self) -> dict:
        """Per forward (the last 100): bytes copied host->GPU, copy time, stall, GB/s."""
        if self.offloader.device.type == "cuda":
            torch.cuda.synchronize(self.offloader.device)
        forwards = [f.summary() for f in self.offloader.forward_stats()]
        return {"backend": self.offloader.name, "forwards": forwards,
                "pinned_host_bytes": self._placement.host_bytes}

    def remove(self) -> None:
        if not self.active:
            return
        self._finalizer.detach()
        _ACTIVE.pop(id(self), None)
        self.offloader.remove()
        self._placement.restore()
        _reset_compiled_code()
        self.active = False
        log.info("offload removed: %d tensors restored to their original devices", len(self._placement.unique_entries()))

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def apply(plan: Plan | str | Path, model: nn.Module, device: str | torch.device = "cuda", *,
          stats: bool = False, progress: bool | None = None) -> Handle:
    """Offload ``model`` as ``plan`` says. On any error the model is left as it was.

    ``device`` is the compute device ("cuda", "cuda:1", or "cpu" to exercise a plan on a
    machine without a GPU, with synchronous copies). ``stats=True`` records CUDA events
    around copies and waits (see ``Handle.stats``); off, the hot path records nothing.
    """
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
    _reset_compiled_code()
    device = _device(device)
    meta = meta_params(model)
    if meta:
        raise ApplyError(f"{len(meta)} params are on the meta device and hold no data: "
                         f"{', '.join(meta[:5])}{' …' if len(meta) > 5 else ''}")
    check_model(plan, model)
    refs = plan_refs(plan, model)
    _check_device_memory(plan, refs, device)

    placement = Placement()
    pin = device.type == "cuda"
    moved = Progress(plan.summary.total_bytes, "apply offload plan", progress)
    offloader = None
    try:
        for layer in plan.layers:  # ties first, so an alias moves with its owner
            for rel, owner in layer.tied.items():
                oref = resolve(model, *split_owner(plan, owner))
                placement.alias(oref, refs[f"{layer.name}.{rel}"])
        offloaded: list[Offloaded] = []
        for layer in plan.layers:  # offload first: frees GPU memory when the model starts there
            if layer.offloaded:
                offloaded += placement.offload_layer([refs[f"{layer.name}.{r}"] for r in layer.offloaded], pin)
                moved.advance(layer.offloaded_bytes)
        for layer in plan.layers:
            for rel in layer.params:
                if rel not in layer.offloaded:
                    placement.move(refs[f"{layer.name}.{rel}"], device)
                    if rel not in layer.tied:  # a tied param is counted once, at its owner
                        moved.advance(layer.params[rel].bytes)
        unplanned = _move_unplanned(model, placement, device)
        offloader = make_offloader(plan.summary.backend, plan=plan, model=model, device=device,
                                   offloaded=offloaded, collect_stats=stats)
        offloader.wrap_modules()
        offloader.post_init()
    except BaseException:
        if offloader is not None:
            offloader.remove()
        placement.restore()
        raise
    finally:
        moved.close()
    s = plan.summary
    log.info("offload applied (%s): %d params resident on %s (%s), %d offloaded to %s host memory (%s), "
             "buffer pool %s, %d unplanned tensors moved", offloader.name,
             sum(len(layer.params) - len(layer.offloaded) for layer in plan.layers), device,
             format_bytes(s.resident_bytes), len(offloaded), "pinned" if pin else "plain",
             format_bytes(placement.host_bytes), format_bytes(s.buffer_bytes), unplanned)
    return Handle(plan, model, offloader, placement)


def _reset_compiled_code() -> None:
    """torch.compile does not guard on module hooks: code compiled for this model class before
    apply() (or remove()) would run without (or with stale) offload hooks. Drop it."""
    import sys

    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
        log.info("torch.compile caches reset so compiled code sees the offload hooks")


def _device(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ApplyError("the plan is for a CUDA device but CUDA is not available here; "
                             "pass device='cpu' to exercise the plan on the CPU")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise ApplyError(f"unsupported device '{device}': use 'cuda', 'cuda:N' or 'cpu'")
    return device


def _check_device_memory(plan: Plan, refs: dict, device: torch.device) -> None:
    if device.type != "cuda":
        return
    offloaded = {f"{layer.name}.{r}" for layer in plan.layers for r in layer.offloaded}
    need = plan.summary.buffer_bytes
    seen: set[int] = set()
    for full, ref in refs.items():
        t = ref.get()
        if full in offloaded or id(t) in seen or t.device == device:
            continue
        seen.add(id(t))
        need += t.numel() * t.element_size()
    free, _total = torch.cuda.mem_get_info(device)
    if need > free:
        raise ApplyError(f"the plan needs {format_bytes(need)} more on {device} but only "
                         f"{format_bytes(free)} is free")


def _move_unplanned(model: nn.Module, placement: Placement, device: torch.device) -> int:
    """Tensors the plan does not name (rotary tables, say) go to the device too, tracked by the
    placement so that remove() (or a rollback) brings them back; returns how many moved."""
    unplanned_params = moved = 0
    for name, module in model.named_modules():
        for is_buffer, store in ((False, module._parameters), (True, module._buffers)):
            for attr, t in store.items():
                if t is None or id(t) in placement.entries:
                    continue
                if not is_buffer:
                    unplanned_params += t.numel() * t.element_size()
                moved += placement.move(TensorRef("", f"{name}.{attr}".lstrip("."), module, attr, is_buffer), device)
    if unplanned_params:
        log.warning("the model has %s of parameters the plan does not name; they were put on %s "
                    "and are not in the plan's memory accounting", format_bytes(unplanned_params), device)
    return moved
