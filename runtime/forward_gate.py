"""What keeps a prefetch plan's shared slots right around its forwards, beyond the schedule itself.

A prefetch slot holds one layer's weights at a time, so three uses of an applied model would compute with
another layer's weights, silently, and are handled here (eager only: code being compiled returns at once):

- **Forwards from two threads at once** would each write the slots the other is reading. The model's forward
  is a gate: a second thread's forward, while one runs, raises ``ConcurrentForwardError`` before it touches
  anything (the first runs on). A forward that ends with an error gives the gate back (an always-called hook).
- **A backward** through a prefetch plan would use whatever the slots hold by then: autograd saved the slot
  buffers, not the weights. The forward still runs (its output is right); when grad mode is on, each output
  that requires grad gets a hook that raises ``BackwardThroughOffloadError`` when a backward reaches it.
- **A submodule called on its own** (``layers[3].mlp(x)``) skips its layer's hook, so its slot may hold another
  layer's weights: each module that owns a prefetched param gets a pre-hook that copies its layer back into its
  slot first when the slot holds another layer (``PrefetchOffloader._copy_now``: correct, synchronous).

A forward that ended with an error also restarts the check of the plan's layer order (it would otherwise
report the interrupted forward's layers as out of order). A plan whose host computes experts without a buffer pool
(the cpu offloader) gets the gate too: each split layer's host buffers are rewritten at every call.

Cost, eager only (compiled code and graph replays call none of these hooks): two hooks a forward, and one
pre-hook a module that owns a prefetched param of a layer sharing its slot; measured on this project's 2-core VM,
a 16-layer tiny Llama with 8 such layers (72 module hooks): 2.04 ms a forward against 1.93 without the module
hooks, about 1.5 us a hook (the Llama-3-8B shape at 8 GB: 162 such hooks, about 0.3 ms on a 150 ms step).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch import nn
from torch.compiler import is_compiling
from torch.utils._pytree import tree_leaves

from runtime.errors import BackwardThroughOffloadError, ConcurrentForwardError


BACKWARD_REFUSED = (
    "backward through a forward of a model with a prefetch plan applied: autograd saved the weights it needs as "
    "prefetch slot buffers, which later layers have overwritten since, so the gradients would be wrong. Offloaded "
    "models are for inference: run the forward under torch.no_grad() or torch.inference_mode(), or remove() the "
    "plan to train (a plan that reads offloaded weights through UVA, --backend uva, keeps them in place)")


def _refuse_backward(_grad: torch.Tensor) -> None:
    raise BackwardThroughOffloadError(BACKWARD_REFUSED)


class ForwardGate:
    """One applied prefetch plan's gate: who runs a forward now, and whether that forward needs grad."""

    def __init__(self, model_name: str, on_abort: Callable[[], None] | None = None) -> None:
        self.model_name = model_name
        self.on_abort = on_abort  # the offloader's reset after a forward that ended with an error (before its join)
        self._lock = threading.Lock()
        self.owner: int | None = None  # the thread whose forward runs now
        self.grad = False  # that forward runs with grad mode on
        self.joined = True  # that forward reached the offloader's join (it did not end with an error)

    def install(self, model: nn.Module, hooks: list) -> None:
        """The model's pre-hook and always-called hook, appended to ``hooks`` (the offloader removes them)."""
        hooks.append(model.register_forward_pre_hook(self._enter))
        hooks.append(model.register_forward_hook(self._leave, always_call=True))

    def _enter(self, _module: nn.Module, _args: tuple) -> None:
        if is_compiling():
            return None
        me = threading.get_ident()
        if self.owner == me:  # a forward this thread runs inside its own forward
            return None
        if not self._lock.acquire(blocking=False):
            raise ConcurrentForwardError(
                f"a forward of this {self.model_name} is running in another thread: the prefetch plan applied to "
                "it fills shared GPU buffer slots during a forward, so its forwards must run one at a time (hold a "
                "lock around them, or give each thread its own model)")
        self.owner, self.grad, self.joined = me, torch.is_grad_enabled(), False
        return None

    def joined_now(self) -> None:
        """The offloader's join ran: the forward reached its end."""
        self.joined = True

    def _leave(self, _module: nn.Module, _args: tuple, output) -> None:
        if is_compiling() or self.owner != threading.get_ident():
            return None
        try:
            if self.on_abort is not None and not self.joined:  # ended with an error before the offloader's join
                self.on_abort()
            elif self.grad and output is not None:
                for leaf in tree_leaves(output):
                    if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                        leaf.register_hook(_refuse_backward)
        finally:
            self.owner = None
            self._lock.release()
        return None


def slot_checks(module: nn.Module, owned: list[str], ensure: Callable[[], None], hooks: list) -> None:
    """Pre-hooks on the submodules of a prefetched layer ``module`` that own its prefetched params (``owned``: the
    params' names relative to it): ``ensure`` puts the layer's weights in its slot when one is called on its
    own."""
    def hook(_module: nn.Module, _args: tuple) -> None:
        if not is_compiling():
            ensure()
        return None

    for path in sorted({rel.rpartition(".")[0] for rel in owned}):
        if path:  # the layer's own params are covered by its own pre-hook
            hooks.append(module.get_submodule(path).register_forward_pre_hook(hook))
