"""Prefetch offloader: a copy stream fills a static GPU buffer pool ahead of the compute stream; and the
mixed offloader, which also points the params the plan puts on UVA at device views of their host copies.

Everything that can be decided at apply time is: per offloaded layer its params with their host copy and
slot buffer (each buffer looked up once), the copies as pointers and sizes, its slot and its copy-done event;
per layer position the offloaded layers whose copy starts there; the functions the hot path calls. The hooks
then only look these up.

Ordering, per the plan's schedule (docs/DESIGN.md):
- where the copy stream waits: ``start_copies`` records an event on the compute stream
  just before the trigger layer runs and the copy stream waits on it, so a slot is
  written only after every earlier layer (its previous user included) has run;
- where the compute stream waits: ``wait_copy`` waits on the layer's copy-done event;
- ``join_after_forward`` makes the compute stream wait for the copy stream, so a
  forward ends with no copy in flight (required to end a CUDA graph capture);
- a capture that ends before the forward does (one graph of several: torch.compile's CUDA-graph
  trees) joins the copies issued in it first (runtime/capture.py), and they count as landed.
Eager hooks call these methods directly; only code being traced by torch.compile goes through
the custom ops (runtime/prefetch_ops.py), whose bodies call the same methods.
Eager calls also track which layer each slot holds (a spanning layer holds every slot); a
layer that finds someone else's weights in its slot (after an interrupted forward, or a submodule
called on its own) gets a synchronous copy. One forward at a time, and a backward that would read
a refilled slot refused: runtime/forward_gate.py. A layer the plan copies ``once`` (its slot's only
user) is copied at apply time and never triggered again.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from torch.autograd.graph import increment_version
from torch.compiler import is_compiling

import runtime.cudart as cudart
import runtime.prefetch_ops as prefetch_ops
from runtime.gpu_buffers import BufferPool
from runtime.capture import captured_copies
from runtime.dtensor import activation
from runtime.errors import ApplyError
from runtime.forward_gate import SAVED_HOOKS_REFUSED, ForwardGate, callers, saved_tensor_hooks_active, slot_checks
from runtime.offloader import Offloaded, Offloader
from runtime.stats import ForwardStats
from runtime.tensors import storage_nbytes
from runtime.uva import read_in_place

log = logging.getLogger("runtime")

_capturing = torch.cuda.is_current_stream_capturing
SPAN_ONLY = -1  # the bytes of a spanning layer's buffers beyond the slots' (shared by spanning layers only)


@dataclass(eq=False)
class _Layer:
    name: str
    position: int
    regions: tuple[int, ...]  # the slot ids whose bytes it writes (a spanning layer: all, and SPAN_ONLY)
    params: list[tuple[Offloaded, torch.Tensor]]  # each prefetched param (its ref and host copy) and its slot buffer
    nbytes: int
    copies: tuple = ()  # (dst pointer, src pointer, bytes) for cudaMemcpyAsync, computed at apply
    use_order: int = 0
    # copy-done events, one set for eager/compiled runs and one for CUDA graph capture: an
    # event last recorded inside a capture must not be waited on outside it
    done: object = None
    done_captured: object = None


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return activation(a)
    for a in kwargs.values():
        if isinstance(a, torch.Tensor):
            return activation(a)
    return None


@dataclass(eq=False)
class PrefetchOffloader(Offloader):
    name = "prefetch"

    pool: BufferPool | None = None
    layers: list[_Layer] = field(default_factory=list)
    triggers: dict[int, list[int]] = field(default_factory=dict)
    slot_owner: dict[int, int] = field(default_factory=dict)
    issued: set[int] = field(default_factory=set)  # copies issued since the last join
    captured: set[int] = field(default_factory=set)  # those issued in the CUDA graph capture under way
    handle_id: int = 0

    def __post_init__(self) -> None:
        self.cuda = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.history: list[ForwardStats] = []
        self.current = ForwardStats()
        self._trigger_events: dict[int, object] = {}
        self._order: list[int] | None = []  # offloaded layers seen in the first forward (order check)
        self._autograd = False  # a forward ran with grad mode on: refills bump the overwritten params' versions
        self._rivals: list[list[torch.Tensor]] = []  # per layer: the params of the others that share its slots
        self.on_bump = None  # told of those bumps (apply: the write check's ``expect``)
        # the hot path's calls, bound at apply (wrap_modules)
        self._memcpy = None
        self._compute_stream = None

    # -- set-up -----------------------------------------------------------------------
    def wrap_modules(self) -> None:
        plan = self.plan
        self.pool = BufferPool(plan.buffer_pool, self.device)
        self.gate = ForwardGate(type(self.model).__name__, self._forward_ended, self._forward_started)  # hooks check it
        position = {layer.name: i for i, layer in enumerate(plan.layers)}
        host_of = {(o.ref.layer, o.ref.rel): o for o in self.offloaded}
        n_layers = len(plan.layers)
        for pl in plan.layers:
            if pl.prefetch is None:
                continue
            params, nbytes = [], 0
            for rel in pl.prefetched:
                params.append((host_of[(pl.name, rel)], self.pool.buffer(rel, pl.params[rel], pl.prefetch.slot)))
                nbytes += pl.params[rel].bytes
            pos = position[pl.name]
            trig = position[pl.prefetch.copy_before]
            # the forward in which this layer uses what the trigger copies
            use = pos + (n_layers if pl.prefetch.previous_forward else 0)
            regions = (pl.prefetch.slot,) if not pl.prefetch.span else (*range(plan.buffer_pool.slots), SPAN_ONLY)
            self.layers.append(_Layer(pl.name, pos, regions, params, nbytes, use))
            if not pl.prefetch.once:  # a slot's only user stays in it once copied at apply time
                self.triggers.setdefault(trig, []).append(len(self.layers) - 1)
        for trig, js in self.triggers.items():
            js.sort(key=lambda j: self.layers[j].use_order)
        if self.cuda:
            if not cudart.available():
                raise RuntimeError("the CUDA runtime library (libcudart) could not be found in this process")
            self._memcpy = cudart.h2d_copier()
            self._compute_stream = functools.partial(torch.cuda.current_stream, self.device)
            for layer in self.layers:
                layer.done, layer.done_captured = torch.cuda.Event(), torch.cuda.Event()
                for o, buf in layer.params:
                    if not o.host.is_pinned():  # asynchronous copies must only ever read pinned memory
                        raise RuntimeError(f"{layer.name}: host copy is not in pinned memory")
                    assert buf.is_cuda and buf.stride() == o.host.stride() and buf.dtype == o.host.dtype
                layer.copies = tuple((buf.data_ptr(), o.host.data_ptr(), storage_nbytes(o.host))
                                     for o, buf in layer.params)
            self._trigger_events = {t: torch.cuda.Event() for t in self.triggers}
            self._trigger_events_captured = {t: torch.cuda.Event() for t in self.triggers}
        self.handle_id = prefetch_ops.register(self)
        offloaded_at = {layer.position: j for j, layer in enumerate(self.layers)}
        for pos, pl in enumerate(plan.layers):
            trig = pos in self.triggers
            j = offloaded_at.get(pos)
            if not trig and j is None:
                continue
            module = self.model.get_submodule(pl.name)
            self.hooks.append(module.register_forward_pre_hook(self._pre_hook(pos, trig, j), with_kwargs=True))
            if j is not None and not pl.prefetch.once:  # a slot's only user never leaves it
                slot_checks(self.gate, module, list(pl.prefetched), functools.partial(self._ensure, j), self.hooks)
        self.hooks.append(self.model.register_forward_hook(self._post_hook()))
        self._rivals = [[o.ref.local for k, other in enumerate(self.layers) if k != j
                         and set(other.regions) & set(layer.regions) for o, _ in other.params]
                        for j, layer in enumerate(self.layers)]
        self.gate.install(self.model, self.hooks, callers(self.model, [pl.name for pl in plan.layers]),
                          self._caller_ended)

    def _pre_hook(self, pos: int, trigger: bool, j: int | None):
        hid = self.handle_id
        start_op = torch.ops.offload_planner.start_copies
        wait_op = torch.ops.offload_planner.wait_copy
        start, wait = self.start_copies, self.wait_copy
        gate = self.gate

        def hook(_module: nn.Module, args: tuple, kwargs: dict):
            # eager (and eager CUDA graph capture, which runs this body once): call the offloader
            # directly; under torch.compile tracing, the custom ops order the steps in the graph
            x = _first_tensor(args, kwargs) if is_compiling() else None
            if x is None:
                gate.check_owner()  # an inner module called from another thread while a forward runs
                if trigger:
                    start(pos)
                if j is not None:
                    wait(j)
                return None
            if trigger:
                start_op(x, hid, pos)
            if j is not None:
                wait_op(x, hid, j)
            return None

        return hook

    def _post_hook(self):
        hid = self.handle_id
        join_op = torch.ops.offload_planner.join
        join = self.join_after_forward

        def hook(_module: nn.Module, _args: tuple, output):
            if not is_compiling():  # eager: the gate's end of the forward joined (_forward_ended)
                return None
            x = activation(output) if isinstance(output, torch.Tensor) else _first_in(output)  # at trace time
            if x is None:
                join()
            else:
                join_op(x, hid)
            return None

        return hook

    def post_init(self) -> None:
        """Point every offloaded param at its slot buffer, then prime the slots the plan
        fills during the previous forward and those its only user keeps (``once``), so the first
        forward finds them ready."""
        for layer in self.layers:
            for o, buf in layer.params:
                o.ref.local.data = buf
        for j, layer in enumerate(self.layers):
            pf = self.plan.layers[layer.position].prefetch
            if pf.previous_forward or pf.once:
                self._copy_now(j)
        self.sync_prev_onload()
        self.current = ForwardStats()

    # -- the hot path -----------------------------------------------------------------
    def start_copies(self, position: int) -> None:
        js = self.triggers[position]
        stats = self.collect_stats
        if not self.cuda:
            for j in js:
                self._copy_now(j)
                if stats:  # no CUDA events here: the layer and its bytes, untimed
                    self.current.copies.append((self.layers[j].name, None, None, self.layers[j].nbytes))
            return
        compute = self._compute_stream()
        capturing = _capturing()
        event = (self._trigger_events_captured if capturing else self._trigger_events)[position]
        event.record(compute)
        stream = self.copy_stream
        stream.wait_event(event)
        timed = stats and not capturing
        handle = stream.cuda_stream
        memcpy = self._memcpy
        for j in js:  # every call names its stream: no stream context needed
            layer = self.layers[j]
            if self._autograd:
                self._bump_rivals(j)
            if timed:
                t0 = torch.cuda.Event(enable_timing=True)
                t0.record(stream)
            for dst, src, n in layer.copies:
                memcpy(dst, src, n, handle)
            (layer.done_captured if capturing else layer.done).record(stream)
            if timed:
                t1 = torch.cuda.Event(enable_timing=True)
                t1.record(stream)
                self.current.copies.append((layer.name, t0, t1, layer.nbytes))
            if stats:
                self.current.bytes += layer.nbytes
            for r in layer.regions:
                self.slot_owner[r] = j
            self.issued.add(j)
            if capturing:
                self.captured.add(j)
        if capturing:
            captured_copies(self)

    def wait_copy(self, j: int) -> None:
        layer = self.layers[j]
        if torch.is_grad_enabled():
            self._grad_forward(j)
        if self._order is not None:
            self._order.append(j)
        if not self._holds(j):  # not what the schedule left there: copy now
            self._copy_now(j)
            self.current.late_copies += 1
            return
        if not self.cuda:
            return
        compute = self._compute_stream()
        if _capturing():
            if j in self.captured:
                compute.wait_event(layer.done_captured)
            elif j in self.issued:  # issued outside this capture: copy again inside it (correct, not overlapped)
                self._copy_now(j)
                self.current.late_copies += 1
            # else: landed before this graph began (previous forward, or an earlier graph of this one)
        elif self.collect_stats:
            t0 = torch.cuda.Event(enable_timing=True)
            t0.record(compute)
            compute.wait_event(layer.done)
            t1 = torch.cuda.Event(enable_timing=True)
            t1.record(compute)
            self.current.stalls.append((layer.name, t0, t1))
        else:
            compute.wait_event(layer.done)

    def join_after_forward(self) -> None:
        self._join_copies()
        if self._order is not None and self._order:
            self._check_order(self._order)
            self._order = None
        self._keep_stats()

    def _keep_stats(self) -> None:
        """The forward's statistics into the history (the last 100 kept)."""
        if self.collect_stats and (self.current.bytes or self.current.stalls):
            self.history.append(self.current)
            del self.history[:-100]
            self.current = ForwardStats()

    def _join_copies(self) -> None:
        """The compute stream waits for every copy issued (none is in flight after it)."""
        if self.cuda and self.issued and self.copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)
        self.issued.clear()
        self.captured.clear()

    def _forward_started(self) -> None:
        """An eager forward of the whole model starts: layers called on their own before the first one are not
        part of the order it checks."""
        if self._order:
            self._order = []

    def _caller_ended(self, completed: bool) -> None:
        """The end of an eager forward of a module between the model and its layers (the base model), inside the
        gate: the join, and its statistics kept as a forward's (dropped after an error); the layers it ran are not
        a whole forward's, so the order check starts again with the next one."""
        if not completed:
            self._forward_failed()
            return
        self._join_copies()
        self._keep_stats()
        if self._order is not None:
            self._order = []

    def _forward_ended(self, completed: bool) -> None:
        """The end of an eager forward, inside the gate (runtime/forward_gate.py): the join (``_forward_failed``
        after an error)."""
        if completed:
            self.join_after_forward()
        else:
            self._forward_failed()

    def _forward_failed(self) -> None:
        """A forward ended with an error: what it issued joined, its partial statistics dropped, and the layer
        order checked again on the next one."""
        self._join_copies()
        self.current = ForwardStats()
        if self._order is not None:
            self._order = []

    def _grad_forward(self, j: int) -> None:
        """Layer ``j`` runs with grad mode on: from now on refills bump versions (``_bump_rivals``); under saved-tensor
        hooks, which autograd does not version-check, a layer sharing its slot is refused (runtime/forward_gate.py)."""
        self._autograd = True
        if self._rivals[j] and saved_tensor_hooks_active():
            raise ApplyError(SAVED_HOOKS_REFUSED.format(layer=self.layers[j].name))

    def _bump_rivals(self, j: int) -> None:
        """Layer ``j``'s refill overwrites what its slots held: the other layers' params there change version, so
        a backward that saved them refuses (runtime/forward_gate.py); the write check is told (runtime/writes.py)."""
        rivals = self._rivals[j]
        for t in rivals:
            increment_version(t)
        if self.on_bump is not None:
            self.on_bump(rivals)

    def _ensure(self, j: int) -> None:
        """Layer ``j``'s weights in its slot, copied now when the slot holds another layer's (a submodule of
        ``j`` called on its own; inside the gate: ``slot_checks``)."""
        if torch.is_grad_enabled():
            self._grad_forward(j)
        if not self._holds(j):
            self._copy_now(j)

    def _holds(self, j: int) -> bool:
        """Whether every slot region of layer ``j`` holds its weights (by the eager bookkeeping)."""
        owner = self.slot_owner
        return all(owner.get(r) == j for r in self.layers[j].regions)

    def join_capture(self) -> None:
        """The capture under way ends (runtime/capture.py): join the copies issued in it, which count as
        landed for whatever runs after this graph."""
        if self.cuda and self.captured and self.copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)
        self.issued -= self.captured
        self.captured.clear()

    def _check_order(self, seen: list[int]) -> None:
        """After the first whole forward: did the offloaded layers run in the plan's order?"""
        if seen == list(range(len(self.layers))):
            return
        n = len(self.layers)
        where = next((i for i, (a, b) in enumerate(zip(seen, range(n))) if a != b), min(len(seen), n))
        if where == len(seen):
            what = f"the forward ended before {self.layers[where].name} ran"
        elif where == n:
            what = f"{self.layers[seen[where]].name} ran again after the plan's last offloaded layer"
        else:
            what = f"{self.layers[seen[where]].name} ran where the plan expects {self.layers[where].name}"
        log.warning(
            "the offloaded layers did not run in the plan's order (step %d: %s); prefetched weights were not "
            "where they were needed and were copied synchronously (correct but slow). Make the spec's layer "
            "order the model's execution order.", where, what)

    def _copy_now(self, j: int) -> None:
        """Synchronous-order copy on the compute stream (priming, recovery, CPU)."""
        layer = self.layers[j]
        if self._autograd:
            self._bump_rivals(j)
        if not self.cuda:
            for o, buf in layer.params:
                buf.copy_(o.host)
        else:
            compute = self._compute_stream()
            capturing = _capturing()
            if not capturing or self.captured:  # (a capture can only join what was forked from it)
                compute.wait_stream(self.copy_stream)
            for dst, src, n in layer.copies:
                self._memcpy(dst, src, n, compute.cuda_stream)
            (layer.done_captured if capturing else layer.done).record(compute)
        if self.collect_stats:
            self.current.bytes += layer.nbytes
        for r in layer.regions:
            self.slot_owner[r] = j

    def sync_prev_onload(self) -> None:
        if self.cuda:
            self.copy_stream.synchronize()
            torch.cuda.current_stream(self.device).synchronize()

    def forward_stats(self) -> list[ForwardStats]:
        return list(self.history)

    def remove(self) -> None:
        if self.cuda and self.copy_stream is not None:  # None once removed: remove() may be retried
            self.sync_prev_onload()
        super().remove()
        prefetch_ops.unregister(self.handle_id)
        if self.pool is not None:
            self.pool.close()
        for layer in self.layers:  # drop every reference into the pool and pinned memory
            layer.params, layer.copies = [], ()
        self.copy_stream = None
        self._trigger_events, self._trigger_events_captured = {}, {}


def _first_in(output) -> torch.Tensor | None:
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(output):
        if isinstance(leaf, torch.Tensor):
            return activation(leaf)
    return None


@dataclass(eq=False)
class MixedOffloader(PrefetchOffloader):
    """Per param, prefetched into the buffer pool or read in place through UVA: the plan's ``uva`` lists say
    which offloaded params GPU kernels read from pinned host memory; every other offloaded param is prefetched
    (pool, copy stream, events and custom ops, over the prefetched params of the layers with a prefetch entry)."""

    name = "mixed"

    def post_init(self) -> None:
        read_in_place(self, self.uva_pairs())
        super().post_init()
