"""Offloaded tensors are read-only while a plan is applied: writes are found, and refused.

A module may write a registered buffer during forward (gpt-fast's KV cache does
``self.k_cache[:, :, pos] = k``). On an offloaded tensor such a write is lost (prefetch: it
lands in a buffer slot the next layer's copy overwrites; the UVA copy fallback: in a copy
dropped after the layer) or changes the host copy that ``remove()`` restores (UVA). The planner
cannot know which tensors a model writes, so the runtime finds out: every in-place write through
PyTorch bumps the tensor's version counter (shared with its views, also under ``no_grad`` and
``inference_mode``; the runtime's own copies into slots and its ``.data`` swaps do not), so
``apply`` records the version of every offloaded tensor and a forward hook on the root module
compares them at the end of every forward (one pass over the offloaded tensors, not per layer).
A difference raises ``OffloadedWriteError`` instead of returning the output, at that forward and
every later one, until ``remove()``.

Under ``torch.compile`` the hook calls ``offload_planner::check_writes``, a custom op that runs
the same comparison when the compiled code runs (compiled code bumps the version counters of the
buffers it mutates, before the op). A CUDA graph replays no Python: the check runs while the
graph is captured (a write during capture is found then) and not on replays; ``remove()``
checks once more. Writes the version counter cannot see are not found: through ``param.data``
(a new counter), or by kernels handed a raw pointer that do not declare the mutation.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass
from operator import attrgetter

import torch
from torch import nn

from runtime.dtensor import activation
from runtime.errors import OffloadedWriteError, written_warning
from runtime.offloader import Offloader

_version = attrgetter("_version")

# weak: the model's hooks keep their watch alive (as runtime/prefetch_ops.py does for offloaders)
_WATCHES: weakref.WeakValueDictionary[int, WriteWatch] = weakref.WeakValueDictionary()
_next_id = [0]


@dataclass(eq=False)
class WriteWatch:
    """The offloaded tensors of one applied plan and their version counters at apply time."""

    names: list[str]
    buffers: list[bool]
    how: list[str]  # per tensor: 'prefetch', 'uva' or 'copy' (what became of a write)
    tensors: list[torch.Tensor]
    versions: list[int]
    key: int = 0

    @classmethod
    def of(cls, offloader: Offloader, how: dict[str, str]) -> WriteWatch:
        refs = [o.ref for o in offloader.offloaded]
        tensors = [ref.local for ref in refs]  # what the model's ops write (a DTensor param's local shard)
        watch = cls([ref.full.lstrip(".") for ref in refs], [ref.is_buffer for ref in refs],
                    [how[ref.full] for ref in refs], tensors, list(map(_version, tensors)))
        _next_id[0] += 1
        watch.key = _next_id[0]
        _WATCHES[watch.key] = watch
        return watch

    def written(self) -> list[tuple[str, bool, str]]:
        """(name, is a buffer, backend) of every offloaded tensor written since apply."""
        now = list(map(_version, self.tensors))
        if now == self.versions:
            return []
        return [(n, b, h) for n, b, h, v, w in zip(self.names, self.buffers, self.how, now, self.versions) if v != w]

    def check(self) -> None:
        written = self.written()
        if written:
            raise OffloadedWriteError(written)

    def install(self, model: nn.Module, offloader: Offloader) -> None:
        """Check at the end of every forward of ``model`` (the hook goes with the offloader's)."""
        if self.tensors:
            offloader.hooks.append(model.register_forward_hook(self._hook()))

    def close(self) -> None:
        _WATCHES.pop(self.key, None)
        self.tensors = []

    def _hook(self):
        key = self.key
        check = torch.ops.offload_planner.check_writes

        def hook(_module: nn.Module, _args: tuple, output):
            if torch.compiler.is_compiling():
                x = _first_tensor(output)
                if x is not None:
                    check(x, key)
                return None
            self.check()
            return None

        return hook


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


def _first_tensor(output) -> torch.Tensor | None:
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(output):
        if isinstance(leaf, torch.Tensor):
            return activation(leaf)
    return None


@torch.library.custom_op("offload_planner::check_writes", mutates_args=("x",))
def check_writes(x: torch.Tensor, key: int) -> None:
    """Raise OffloadedWriteError when the model has written an offloaded tensor (compiled code)."""
    watch = _WATCHES.get(key)
    if watch is not None:
        watch.check()


@check_writes.register_fake
def _(x: torch.Tensor, key: int) -> None:
    return None
