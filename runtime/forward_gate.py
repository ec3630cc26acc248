"""What keeps a plan's shared buffers right around its forwards, beyond the schedule itself.

A prefetch slot holds one layer's weights at a time, and a split layer's host buffers (host experts) one call's
rows, so these uses of an applied model would compute with another layer's weights, silently; each is handled
(eager only: code being compiled passes straight through):

- **Forwards from two threads at once** would each write the buffers the other is reading. The model's forward is
  wrapped in a gate (``model.forward``, an instance attribute ``remove()`` takes off, signature kept): a second
  thread's forward while one runs raises ``ConcurrentForwardError`` before it touches anything, and so does a
  submodule of a prefetched layer called from another thread meanwhile (``check_owner``). The gate is given back
  however the forward ends (``try``/``finally``: an error, ``KeyboardInterrupt``), and a forward of the same model
  inside its own forward (the same thread) passes through, the gate given back when the outermost one ends.
- **A backward** through a prefetch plan would read, for a layer whose slot another layer has refilled since, that
  layer's weights: autograd saved the slot, not the weights. Each refill bumps the version counter of the params
  it overwrites (``PrefetchOffloader``, once a forward has run with grad mode on), so autograd's own check refuses
  such a backward ("modified by an inplace operation"); a backward whose saved weights are still in their slots,
  or that saved none (a frozen backbone), runs and is exact. Autograd does not check tensors saved through
  ``torch.autograd.graph.saved_tensors_hooks`` (``save_on_cpu``, activation offloaders), so a grad-mode forward
  under such hooks is refused at its first layer that shares a slot (``saved_tensor_hooks_active``).
- **A submodule called on its own** (``layers[3].mlp(x)``) skips its layer's hook, so its slot may hold another
  layer's weights: the forward of each module that owns a prefetched param of a layer sharing its slot takes the
  gate and copies its layer back into its slot first (``slot_checks``; ``PrefetchOffloader._ensure``: correct,
  synchronous); another thread's forward of the model meanwhile is refused.
- **A forward of a module between the model and its plan's layers** (``model.model(...)``, the base model without its
  head) takes the gate as the model's does (``callers``): a second thread's forward of the model or of that module
  meanwhile is refused; at its end the copies are joined and its statistics kept as a forward's, and the check of
  the layer order waits for a forward of the whole model.

A forward that ended with an error also restarts the check of the plan's layer order (it would otherwise report
the interrupted forward's layers as out of order) and drops its partial statistics.

- **A layer whose host computes experts** (the cpu backend) is used by one call at a time: a second thread's call of
  it, or a forward meeting another thread's call inside it, is refused, and so is a forward of the model from a
  hook inside its experts (runtime/cpu_experts.py: the layer's host buffers).
- **``remove()`` while a forward runs** (in another thread, or from inside the forward) is refused
  (``ForwardGate.exclusive``), and no forward starts while it runs.

Calling the plan's layers themselves (``model.model.layers[3](x)``) from several threads at once, with no forward
of a module above them running, is not gated; nor is anything under torch.compile (its backward included): in
particular a prefetched layer's submodule compiled on its own (``torch.compile(layers[1].mlp)``) is not checked
and may read another layer's weights; compile the whole model or whole layers, whose hooks run as custom ops.

Cost, eager only: one wrapper call a forward, and one pre-hook a module that owns a prefetched param of a layer
sharing its slot; measured on this project's 2-core VM, a 16-layer tiny Llama with 8 such layers (72 module hooks):
2.04 ms a forward against 1.93 without the module hooks, about 1.5 us a hook. On the H200 (bench/bench_hot_path.py,
2026-12-02 11:20, docs/BENCHMARKS.md): the Llama-3-8B shape's 12 GB plan (32 layers offloaded) issues an offloaded
layer in 1.14x a hook-free layer's time, gate and hooks included (1.20-1.21x in the runs before the gate)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.compiler import is_compiling

from runtime.errors import ConcurrentForwardError

_ABSENT = object()

SAVED_HOOKS_REFUSED = (
    "'{layer}' runs with grad mode on under torch.autograd.graph.saved_tensors_hooks (save_on_cpu, an activation "
    "offloader): it reads its weights from a prefetch slot that a later layer refills, and autograd does not check "
    "tensors saved through such hooks, so a backward would silently use the other layer's weights. Run the forward "
    "under torch.no_grad() or torch.inference_mode(), outside those hooks, or remove() the plan to train")


def saved_tensor_hooks_active() -> bool:
    """Whether ``torch.autograd.graph.saved_tensors_hooks`` are in force on this thread (False where this torch does
    not say)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return False
    try:
        return top(True) is not None
    except TypeError:  # an older signature, without ignore_is_tracing
        return top() is not None


class ForwardGate:
    """One applied plan's gate: which thread runs a forward of the model now, and how deep."""

    def __init__(self, model_name: str, on_end: Callable[[bool], None] | None = None,
                 on_start: Callable[[], None] | None = None) -> None:
        self.model_name = model_name
        self.on_start = on_start  # the offloader's start of a forward, inside the gate
        self.on_end = on_end  # the offloader's end of a forward, inside the gate: on_end(completed)
        self._lock = threading.Lock()
        self.owner: int | None = None  # the thread whose forward runs now
        self.depth = 0  # forwards of the model that thread is inside
        self.active = True  # until the plan is removed

    def install(self, model: nn.Module, hooks: list, inner: Iterable[nn.Module] = (),
                inner_end: Callable[[bool], None] | None = None) -> None:
        """Wrap ``model.forward``, and the forwards of ``inner`` modules (``callers``: a forward of one of them runs
        the plan's layers without the model's own, so it takes the gate too, with the offloader's start and
        ``inner_end`` for its end: not the whole model's, whose layers it does not all run); what undoes each is
        appended to ``hooks`` (the offloader removes them)."""
        for module in (model, *inner):
            self.wrap_module(module, hooks, self.on_end if module is model else inner_end)

    def wrap_module(self, module: nn.Module, hooks: list, on_end: Callable[[bool], None] | None,
                    before: Callable[[], None] | None = None) -> None:
        """``module.forward`` replaced by ``wrap``'s (an instance attribute); its ``_Unwrap`` appended to ``hooks``."""
        previous = module.__dict__.get("forward", _ABSENT)
        gated = self.wrap(module.forward, on_end, before)
        module.forward = gated
        hooks.append(_Unwrap(self, module, gated, previous))

    def wrap(self, forward: Callable, on_end: Callable[[bool], None] | None,
             before: Callable[[], None] | None = None) -> Callable:
        """``forward`` taking the gate, calling the offloader's start and ``on_end`` (``on_end(completed)``) when it
        is the outermost forward of this thread, and ``before`` inside the gate before every call."""
        on_start = self.on_start

        @functools.wraps(forward)  # inspect.signature(model.forward) still reads the model's own (generate() does)
        def gated(*args, **kwargs):
            if is_compiling() or not self.active:  # (not active: removed, and still called through a user's wrapper)
                return forward(*args, **kwargs)
            me = threading.get_ident()
            if self.owner == me:  # a forward of the model inside its own forward, on this thread
                self.depth += 1
                try:
                    if before is not None:
                        before()
                    return forward(*args, **kwargs)
                finally:
                    self.depth -= 1
            if not self._lock.acquire(blocking=False):
                raise self.refusal()
            self.owner, self.depth = me, 1
            completed = False
            try:
                if on_start is not None:
                    on_start()
                if before is not None:
                    before()
                out = forward(*args, **kwargs)
                completed = True
                return out
            finally:
                try:
                    if on_end is not None:
                        on_end(completed)
                finally:
                    self.owner, self.depth = None, 0
                    self._lock.release()

        return gated

    @contextlib.contextmanager
    def exclusive(self, what: str):
        """Hold the gate for ``what`` (``remove()``): refused while a forward of the model runs, on any thread
        (inside one on this thread too), and no forward starts meanwhile."""
        if not self._lock.acquire(blocking=False):
            raise ConcurrentForwardError(
                f"{what} while a forward of this {self.model_name} is running (in another thread, or the call is "
                "inside that forward): the forward would lose its weights mid-way. Call it after the forward returns")
        try:
            yield
        finally:
            self._lock.release()

    def check_owner(self) -> None:
        """Raise when another thread's forward of the model runs now (a submodule called from here meanwhile)."""
        owner = self.owner
        if owner is not None and owner != threading.get_ident():
            raise self.refusal()

    def refusal(self) -> ConcurrentForwardError:
        return ConcurrentForwardError(
            f"a forward of this {self.model_name} is running in another thread: the plan applied to it rewrites "
            "shared buffers during a forward (prefetch slots, host experts' rows), so its forwards must run one "
            "at a time (hold a lock around them, or give each thread its own model)")


def callers(model: nn.Module, names: Iterable[str]) -> list[nn.Module]:
    """The modules between ``model`` and each of its submodules ``names`` (``model.model`` for
    ``model.model.layers.3``) whose class has a forward of its own (not a ModuleList): calling one runs those
    submodules without ``model``'s forward."""
    found: dict[str, nn.Module] = {}
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts)):
            path = ".".join(parts[:i])
            if path not in found:
                module = model.get_submodule(path)
                if type(module).forward is not nn.Module.forward:
                    found[path] = module
    return list(found.values())


class _Unwrap:
    """Takes the gate off ``model.forward`` (what ``remove()`` calls for each of an offloader's hooks): the forward
    before it comes back, unless something else was set there since (a user's wrapper, kept; the gate inside it
    then just calls through)."""

    def __init__(self, gate: ForwardGate, model: nn.Module, gated: Callable, previous: object) -> None:
        self.gate, self.model, self.gated, self.previous = gate, model, gated, previous

    def remove(self) -> None:
        self.gate.active = False
        if self.model.__dict__.get("forward") is not self.gated:
            return
        if self.previous is _ABSENT:
            self.model.__dict__.pop("forward", None)
        else:
            self.model.forward = self.previous


def slot_checks(gate: ForwardGate, module: nn.Module, owned: list[str], ensure: Callable[[], None],
                hooks: list) -> None:
    """The forwards of the submodules of a prefetched layer ``module`` that own its prefetched params (``owned``: the
    params' names relative to it) take the gate and, inside it, ``ensure`` that the layer's weights are in its slot
    (so a forward of the model on another thread cannot refill the slot between that check and the submodule's
    use of it: it is refused, as the submodule is while such a forward runs)."""
    for path in sorted({rel.rpartition(".")[0] for rel in owned}):
        if path:  # the layer's own params are covered by its own pre-hook
            gate.wrap_module(module.get_submodule(path), hooks, None, ensure)
