"""Offloaded tensors are read-only while a plan is applied: writes are refused, or found.

A module may write a registered buffer during forward (gpt-fast's KV cache does
``self.k_cache[:, :, pos] = k``). On an offloaded tensor such a write is lost (prefetch: it
lands in a buffer slot the next layer's copy overwrites; the UVA copy fallback: in a copy
dropped after the layer) or changes the host copy that ``remove()`` restores (UVA). The planner
cannot know which tensors a model writes, so the runtime makes sure, in two layers:

1. Before anything moves, ``apply`` refuses a plan that offloads registered buffers (the
   model's own registration, not the plan's flag: specs read from checkpoints cannot tell),
   unless the caller passes ``read_only_buffers=True`` (quantized weights kept as buffers).
   Buffers are what models write in forward; this holds on every path, compiled or graphed.
2. Every in-place write through PyTorch bumps the tensor's version counter (shared with its
   views, also under ``no_grad`` and ``inference_mode``; the runtime's own copies into slots
   and its ``.data`` swaps do not), so ``apply`` records the version of every offloaded tensor
   and a forward hook on the root module compares them at the end of every eager forward (one
   pass over the offloaded tensors, not per layer). A difference raises ``OffloadedWriteError``
   instead of returning the output, at that forward and every later one, until ``remove()``,
   which warns and restores what the host copies hold.

The check in 2 does not run while dynamo traces (the hook is traced away), and it could not
see compiled writes to prefetched tensors anyway: their slot buffers alias one another, so
compiled code writes them through a synthetic base whose counter is not theirs. A CUDA graph
replays no Python; eager capture runs the check once. Under ``torch.compile`` and CUDA graphs,
then, layer 1 is the guarantee (buffers), and a param written in forward is not found. Writes
no version counter sees are not found anywhere: through ``param.data`` (a new counter), or by
kernels handed a raw pointer that do not declare the mutation.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from operator import attrgetter

import torch
from torch import nn

from runtime.errors import OffloadedWriteError, written_warning
from runtime.offloader import Offloader
from runtime.tensors import TensorRef

_version = attrgetter("_version")


@dataclass(eq=False)
class WriteWatch:
    """The offloaded tensors of one applied plan and their version counters at apply time."""

    names: list[str]
    buffers: list[bool]
    how: list[str]  # per tensor: 'prefetch', 'uva' or 'copy' (what became of a write)
    tensors: list[torch.Tensor]
    versions: list[int]
    index: dict[int, int] = field(default_factory=dict)  # id(tensor) -> its position in ``tensors``

    def __post_init__(self) -> None:
        self.index = {id(t): i for i, t in enumerate(self.tensors)}

    @classmethod
    def of(cls, offloader: Offloader, how: dict[str, str]) -> WriteWatch:
        refs = [o.ref for o in offloader.offloaded]
        tensors = [ref.local for ref in refs]  # what the model's ops write (a DTensor param's local shard)
        return cls([ref.full.lstrip(".") for ref in refs], [ref.is_buffer for ref in refs],
                   [how[ref.full] for ref in refs], tensors, list(map(_version, tensors)))

    def written(self) -> list[tuple[str, bool, str]]:
        """(name, is a buffer, backend) of every offloaded tensor written since apply."""
        now = list(map(_version, self.tensors))
        if now == self.versions:
            return []
        return [(n, b, h) for n, b, h, v, w in zip(self.names, self.buffers, self.how, now, self.versions) if v != w]

    def expect(self, bumped: list[torch.Tensor]) -> None:
        """The runtime bumped these tensors' version counters itself (a prefetch refill, so that autograd refuses a
        backward reading the overwritten weights: runtime/forward_gate.py): not a write of the model's."""
        for t in bumped:
            i = self.index.get(id(t))
            if i is not None:
                self.versions[i] += 1

    def check(self) -> None:
        written = self.written()
        if written:
            raise OffloadedWriteError(written)

    def install(self, model: nn.Module, offloader: Offloader) -> None:
        """Check at the end of every forward of ``model`` (the hook goes with the offloader's)."""
        if self.tensors:
            offloader.hooks.append(model.register_forward_hook(self._hook()))

    def close(self) -> None:
        self.tensors, self.versions, self.index = [], [], {}

    def _hook(self):
        def hook(_module: nn.Module, _args: tuple, _output):
            if not torch.compiler.is_compiling():  # traced away: see the module's docstring
                self.check()

        return hook


def buffer_problems(refs: list[TensorRef], read_only_buffers: bool) -> list[str]:
    """With ``read_only_buffers=False``: the registered buffers among the tensors the plan offloads."""
    if read_only_buffers:
        return []
    names = [ref.full.lstrip(".") for ref in refs if ref.is_buffer]
    if not names:
        return []
    shown = ", ".join(names[:6]) + (f" … and {len(names) - 6} more" if len(names) > 6 else "")
    return [f"the plan offloads {len(names)} registered buffer{'s' if len(names) != 1 else ''} ({shown}); a module "
            f"may write its buffers during forward (a KV cache, running statistics), and a write to an offloaded "
            f"tensor would be lost. Keep them resident (plan again with offload.params naming only what may move), "
            f"or, if the model never writes them (quantized weights kept as buffers), pass read_only_buffers=True "
            f"(each eager forward still checks)"]


def report_writes(watch: WriteWatch) -> None:
    """At ``remove()``: warn about every offloaded tensor the model wrote (remove() then puts back
    what its host copy holds), and stop watching."""
    written = watch.written()
    watch.close()
    if written:
        warnings.warn(written_warning(written), RuntimeWarning, stacklevel=4)


def backend_of_each(offloader: Offloader) -> dict[str, str]:
    """Per offloaded tensor (full name): 'prefetch', 'uva', or 'copy' (the UVA fallback that copies
    a layer's params in before it runs)."""
    prefetched = {f"{layer.name}.{rel}" for layer in offloader.plan.layers if layer.prefetch is not None
                  for rel in layer.prefetched}
    out = {}
    for o in offloader.offloaded:
        if o.ref.full in prefetched:
            out[o.ref.full] = "prefetch"
        else:
            placeholder = o.ref.local.numel() == 0 and o.host.numel() > 0  # runtime/uva.py's fallback
            out[o.ref.full] = "copy" if placeholder else "uva"
    return out
