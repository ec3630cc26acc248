"""The cpu backend: routed experts split by expert, some computed by the host CPU beside the GPU.

A plan layer's ``experts`` (schemas/plan_experts.py) cuts its routed-expert params along the expert
dimension: ``gpu`` experts' slices go to GPU memory, ``uva`` experts' to pinned host memory that GPU kernels
read in place, ``cpu`` experts' to host memory that the host CPU computes from. The experts module's forward
is replaced (an instance attribute, removed again by ``restore``) by ``SplitForward``:

1. the routed tokens' hidden states and their routing are copied to the layer's host buffers (pinned,
   asynchronous; made at the layer's first call and reused, ``_Staging``) and the stream then writes a count to
   host memory (or records an event, where the issuing thread computes);
2. the GPU parts (gpu, uva) are launched in one pass (``runtime.expert_math.parts_rows``: the pairs sorted
   once, each part's grouped matmuls, the UVA part's first so that it reads only the experts its rows route
   to), which reads no value back;
3. on a GPU whose streams can wait on a flag in host memory (``runtime.stream_wait``): the stream is told to
   wait for the host's rows, their copy to the GPU is queued behind that wait, and the host's part goes to
   ``HostWorker``, one thread of the process that reads host memory until the stream's count arrives, computes
   the experts (``host_rows``: the padded pass through runtime/host_matmul.c's kernel, every CPU of the process's
   affinity but one: that one is left to the thread issuing the forward) into the pinned rows and raises the
   flag. That thread makes no CUDA call and frees no buffer a stream used (either can wait for a stream whose
   queue is full, while the stream waits for the thread: a stalled `generate()`). The issuing thread never
   waits: it goes on to the next layers' kernels, so their Python and launches overlap the host's matmuls, and
   per layer the GPU's UVA reads and the host's part run at once, joined by the stream's wait. Elsewhere (no
   flag waits, or the CPU as device) the issuing thread itself waits for the event and computes;
4. the parts' rows are added (disjoint: exact), in place and each part's own let go before the next part runs
   (so a layer holds what transformers' grouped module holds, however many parts run), and each token's k
   choices summed once.

A split layer's experts in host memory (the plan's uva and cpu experts) are one array in pinned memory, the uva
experts first, stored as the host reads them fastest (``Layout.for_host``: [E, out, in]); the host computes its
last experts, GPU kernels read the others in place through UVA (``_Placement``). On a GPU each split layer with
UVA experts has a ``HostGuard`` (runtime/host_guard.py): from the stream's wait for the host's rows, the layer's UVA
reads and the host's own time it keeps the layer's *level*, how many of those experts the host computes, moving
the cut in that array: a host slower than the plan's profile hands experts to the link, one faster takes experts
from it, until both sides finish together (``ExpertSplits.host_levels`` reports each layer's). A call above
``cpu_max_tokens`` has the GPU read them all (level 0).

An error in the host's thread still raises the flag (the stream goes on with rows left zero) and is raised by the
next call of any split layer of the plan.

The host's matmuls are this project's kernel (``runtime/host_matmul.c``: each touched expert's weights read once
for all of its rows, built at first use with the machine's C compiler), not a CPU MoE library (kt-kernel): measured
on the H200's host (bench/probe_host_kernel.py, 2026-12-03) it reads 64 Qwen3-MoE experts at 68-99 GB/s at 1-4
rows an expert where torch.bmm (oneDNN's AMX kernel) read 43-77; kt-kernel is not installed here nor on the GPU
machine (no network), wants its own packed copy of the weights and a build for the host's AMX, and would have to
be carried. Without a C compiler the host runs the padded torch.bmm pass (``runtime.expert_math``). Above a call
size the host is the slower one (2,048 tokens: 298 ms a layer with torch's grouped kernel, compute-bound):
``cpu_max_tokens`` then sends the cpu experts to the GPU through UVA (their host memory is pinned), so a prefill
runs as the UVA plan does.

CUDA graphs: the host's part is not captured (no host function is launched on the stream): a capture that
reaches a layer whose host computes experts raises ``HostExpertsCaptureError`` naming the backend; splits
with only gpu and uva experts are captured like any kernel. torch.compile: a forward with host experts is
excluded from compilation (``torch.compiler.disable``: a graph break at each such layer, run eagerly).

Params are restored bit-identically: ``restore`` puts every expert's slice back into a tensor of the
original shape, stride, dtype and device. While applied, a split param's ``.data`` is an empty placeholder
(its true value is assembled on demand for ``state_dict``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

import runtime.host_matmul as host_matmul
from runtime.errors import ApplyError, ConcurrentForwardError
from runtime.host_worker import CPU_BACKEND, HostWorker, host_threads
from runtime.forward_gate import ForwardGate, callers
from runtime.host_guard import CudaMarks, HostGuard, Marks
from runtime.expert_math import Layout, host_rows, is_experts_module, join_rows, parts_rows, rows_dtype
from runtime.pinned import HostArena, pack
from runtime.shape_graphs import GraphPool, ShapeGraphs
from runtime.stream_wait import HostFlag, ThreadFlag, flag_waits, new_flag
from runtime.tensors import TensorRef, resolve
from runtime.uva import UvaOffloader, device_view
from schemas import Plan, PlanLayer
from schemas.expert_graphs import offloaded_beside
from schemas.plan_experts import ExpertSplit, experts_module, host_bytes, host_computes

log = logging.getLogger("runtime")


def new_marks(device: torch.device) -> Marks | None:
    """The marks a split layer's guard times its calls with: CUDA events on a GPU, none elsewhere."""
    return CudaMarks() if device.type == "cuda" else None

_ABSENT = object()


REENTERED = (
    "'{module}' was called again while its own call was still writing the layer's host buffers (a forward of the "
    "model from a hook inside its experts): the host's part would read the second call's inputs. Run that forward "
    "after the layer's call returns")


class HostExpertsCaptureError(ApplyError):
    """A CUDA graph capture reached experts the host computes: host work is not part of a captured graph."""


def _module_path(split_params: list[str]) -> tuple[str, list[str]]:
    """(the module holding the split params, relative to the layer; their attribute names)."""
    return experts_module(split_params), [rel.rpartition(".")[2] for rel in split_params]


def split_problems(plan: Plan, model: nn.Module) -> list[str]:
    """Why a layer's expert split cannot run on ``model`` (its experts module found and understood)."""
    problems: list[str] = []
    for layer in plan.layers:
        split = layer.experts
        if split is None:
            continue
        parent, attrs = _module_path(split.params)
        if len({rel.rpartition(".")[0] for rel in split.params}) != 1:
            problems.append(f"{layer.name}: the split params {', '.join(split.params)} are not of one experts module")
            continue
        path = f"{layer.name}.{parent}" if parent else layer.name
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue  # check_model reports the missing params
        problems += _module_problems(path, module, attrs, layer)
    return problems


def _module_problems(path: str, module: nn.Module, attrs: list[str], layer: PlanLayer) -> list[str]:
    n = layer.moe.experts if layer.moe is not None else 0
    if not is_experts_module(module):
        return [f"'{path}' ({type(module).__name__}) is not an experts module as transformers 5 writes them "
                f"(forward(hidden_states, top_k_index, top_k_weights) over 3-D expert params); experts split by "
                f"expert ({CPU_BACKEND}, or hot experts) need one"]
    layout = Layout.of(module)
    problems = []
    missing = [a for a in layout.names if a not in attrs]
    if missing:
        problems.append(f"'{path}': its forward reads {', '.join(missing)}, which the split leaves out "
                        f"(split every per-expert param of the module: {', '.join(layout.names)})")
    per_expert = [a for a, t in module.named_parameters(recurse=False) if t.dim() >= 1 and t.shape[0] == n]
    extra = [a for a in per_expert if a not in attrs]
    if extra:
        problems.append(f"'{path}': {', '.join(extra)} {'is' if len(extra) == 1 else 'are'} per expert but not in "
                        "the split")
    return problems


@dataclass(eq=False)
class _Part:
    """Some experts of one layer: their slices of each per-expert tensor, and global -> local ids."""

    weights: dict[str, torch.Tensor]
    table: torch.Tensor  # [E]: part-local id, or n (not in this part)
    layout: Layout


@dataclass(frozen=True)
class _GpuParts:
    """The experts GPU kernels compute at one level: the host-memory experts the GPU reads through UVA first, then
    those in GPU memory, in one pass (``parts_rows``)."""

    weights: list[dict[str, torch.Tensor]]
    layouts: list[Layout]
    table: torch.Tensor  # [E]: place in the parts taken in order, or their total (the host's experts)


def expert_places(host_ids: list[int], gpu_ids: list[int], experts: int) -> torch.Tensor:
    """[E] on the CPU: each expert's place in the host-memory array (``host_ids``' order), or the array's length
    plus its place among the GPU-resident experts (``gpu_ids``' order); -1 for an expert in neither."""
    place = torch.full((experts,), -1, dtype=torch.long)
    place[torch.tensor(host_ids, dtype=torch.long)] = torch.arange(len(host_ids))
    place[torch.tensor(gpu_ids, dtype=torch.long)] = len(host_ids) + torch.arange(len(gpu_ids))
    return place


@dataclass(eq=False)
class _Placement:
    """Where a split layer's experts are computed at each *level* (runtime/host_guard.py). Its experts in host memory
    are one array, the plan's uva experts and then its cpu experts (``ids``, in the order of their slices); at level
    L the host computes the last L of them and GPU kernels read the others through UVA, in one pass with the layer's
    experts in GPU memory. The plan's split is level ``planned``; level 0 (a call above ``cpu_max_tokens``, or a
    layer without cpu experts) has the GPU read them all. A level's parts are views of the same memory, made at the
    level's first use (the plan's level and level 0 at apply), its GPU table from ``place`` on the GPU (no copy)."""

    ids: list[int]  # the experts in host memory: the plan's uva experts, then its cpu experts
    planned: int  # the plan's cpu experts: the host computes the last ``planned`` of ``ids``
    host_layout: Layout  # the layout the host-memory array is stored in
    layout: Layout  # the module's: the GPU-resident experts'
    host: dict[str, torch.Tensor]  # the host-memory array, as the host reads it
    uva: dict[str, torch.Tensor]  # the same, as GPU kernels read it (device views; the host's own on the CPU)
    gpu: dict[str, torch.Tensor] | None  # the experts in GPU memory
    place: torch.Tensor  # [E] on the compute device: place in ``ids``, else len(ids) + place among the GPU's
    host_place: torch.Tensor  # the same on the CPU
    cache: dict[int, tuple[_Part | None, _GpuParts | None]] = field(default_factory=dict)

    @property
    def most(self) -> int:
        """The highest level: every host-memory expert on the host."""
        return len(self.ids)

    def at(self, level: int) -> tuple[_Part | None, _GpuParts | None]:
        """(the host's part, the GPU's parts) at ``level``: the host computes ``ids[len(ids) - level:]``."""
        parts = self.cache.get(level)
        if parts is None:
            parts = self.cache[level] = (self._host_part(level), self._gpu_parts(len(self.ids) - level))
        return parts

    def _host_part(self, level: int) -> _Part | None:
        if not level:
            return None
        n = len(self.ids)
        cut, place = n - level, self.host_place
        table = torch.where((place >= cut) & (place < n), place - cut, level)
        return _Part({a: w[cut:] for a, w in self.host.items()}, table, self.host_layout)

    def _gpu_parts(self, cut: int) -> _GpuParts | None:
        weights = ([{a: w[:cut] for a, w in self.uva.items()}] if cut else []) + ([self.gpu] if self.gpu else [])
        if not weights:
            return None
        n, place = len(self.ids), self.place
        on_gpu = place.numel() - n  # every expert is in one place: those not in host memory are in GPU memory
        table = torch.where(place < cut, place, torch.where(place >= n, place - n + cut, cut + on_gpu))
        layouts = ([self.host_layout] if cut else []) + ([self.layout] if self.gpu else [])
        return _GpuParts(weights, layouts, table)


@dataclass(eq=False)
class _Staging:
    """One split layer's host buffers: the routed tokens' inputs copied to the host and the rows the host writes,
    made on the issuing thread at a layer's first call and grown (never shrunk) when a call needs more, pinned on a
    GPU. Nothing is allocated or freed per call, and the host's thread never frees a buffer: freeing a pinned
    buffer that a copy used records an event on the copy's stream, which blocks while that stream's queue is full
    (the stream waiting for the host's thread: runtime/stream_wait.py). Buffers outgrown stay until ``release``
    (a copy or the host's thread may still be using them)."""

    pin: bool
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    outgrown: list[torch.Tensor] = field(default_factory=list)

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous ``shape`` of ``dtype`` at the start of buffer ``name``."""
        need = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.dtype != dtype or buf.numel() < need:
            if buf is not None:
                self.outgrown.append(buf)
            size = max(need, 2 * buf.numel() if buf is not None and buf.dtype == dtype else 0)
            buf = self.buffers[name] = torch.empty(size, dtype=dtype, pin_memory=self.pin)
        return buf[:need].view(shape)

    def release(self) -> None:
        """Drop every buffer (after the stream and the host's thread are done with them)."""
        self.buffers.clear()
        self.outgrown.clear()


@dataclass(eq=False)
class SplitForward:
    """An experts module's forward while its experts are split (the steps in the module docstring)."""

    module: nn.Module
    layout: Layout
    device: torch.device
    placement: _Placement  # where its experts are computed at each level
    split: ExpertSplit  # the plan's: which calls the host computes at (``host_computes``)
    worker: HostWorker | None = None  # the host's thread, where the stream can wait for it (step 3)
    flag: HostFlag | ThreadFlag | None = None  # raised by the host's thread when its rows are written
    staged: HostFlag | None = None  # written by the stream when the routed tokens are on the host (a GPU's worker)
    staging: _Staging = field(default_factory=lambda: _Staging(pin=False))
    gate: ForwardGate | None = None  # the applied plan's (``ExpertSplits.attach``): another thread's forward refused
    guard: HostGuard | None = None  # moves the host's level to the host's measured speed (a GPU's worker)
    graphs: ShapeGraphs | None = None  # level 0's eager calls at decode shapes, from CUDA graphs (runtime/shape_graphs.py)
    busy: threading.Lock = field(default_factory=threading.Lock)  # held by a call using the layer's host buffers
    user: int | None = None  # the thread holding ``busy``

    def __call__(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                 *args, **kwargs) -> torch.Tensor:
        tokens = hidden_states.shape[0]
        level = self.placement.planned if host_computes(self.split, tokens) else 0
        if level and self.gate is not None:
            self.gate.check_owner()  # the layer called from another thread while a forward runs
        if level and self.guard is not None and not self._capturing():  # (a capture is refused by _to_host)
            level = self.guard.host_turn()  # the level the host's measured speed gives (runtime/host_guard.py)
        if not level:
            return (self.graphs or self.gpu_rows)(hidden_states, top_k_index, top_k_weights)
        me = threading.get_ident()
        if not self.busy.acquire(blocking=False):  # its host buffers are in use by another call
            if self.user == me:
                raise ApplyError(REENTERED.format(module=type(self.module).__name__))
            raise ConcurrentForwardError(
                f"'{type(self.module).__name__}' of this {self.gate.model_name if self.gate is not None else 'model'}"
                " is running in another thread (a call of the layer or a forward of the model): its host buffers are "
                "rewritten at every call, so the model's forwards and its layers' calls must run one at a time (hold a "
                "lock around them, or give each thread its own model)")
        self.user = me
        try:
            return self._rows(hidden_states, top_k_index, top_k_weights, level)
        finally:
            self.user = None
            self.busy.release()

    def _capturing(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def gpu_rows(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
                 ) -> torch.Tensor:
        """The layer's rows at level 0: every expert computed by GPU kernels, nothing read back."""
        return self._rows(hidden_states, top_k_index, top_k_weights, 0)

    def _rows(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
              level: int) -> torch.Tensor:
        """The layer's rows with ``level`` of the host's experts computed on the host (0: none, or no host part)."""
        tokens = hidden_states.shape[0]
        host, gpu = self.placement.at(level)
        staged = self._to_host(hidden_states, top_k_index, top_k_weights) if host is not None else None
        rows = None  # the parts' rows added in place: one [T·k, H] beside a part's own, however many parts run
        guard = self.guard if staged is not None and self.worker is not None else None
        stream = None
        if guard is not None:
            stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
            guard.before_parts(stream)
        if gpu is not None:
            rows = parts_rows(self.module, self.layout, gpu.weights, gpu.table, hidden_states, top_k_index,
                              top_k_weights, gpu.layouts)
        if guard is not None:
            guard.after_parts(stream)
        if staged is not None:
            r = self._host_async(host, *staged) if self.worker is not None else self._host_rows(host, *staged)
            if guard is not None:
                guard.after_wait(stream)
            if r is not None:
                rows = r if rows is None else rows.add_(r)
        if rows is None:  # no pair reached any expert (the host's part held them all and none was routed)
            return torch.zeros_like(hidden_states)
        return join_rows(rows, tokens, hidden_states.dtype)

    def _to_host(self, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor):
        """The routed tokens' inputs in this layer's host buffers, and what says they have landed: on a GPU a count
        the stream writes after the copies (the host's thread) or an event (the issuing thread), else None."""
        if self.worker is not None:
            self.worker.check()
        cuda = self.device.type == "cuda"
        if self._capturing():
            raise HostExpertsCaptureError(
                f"a CUDA graph capture reached '{type(self.module).__name__}', whose experts {CPU_BACKEND} are "
                "computed by the host CPU: host work is not part of a captured graph. Run this plan eagerly (or "
                "under torch.compile without CUDA graphs), or plan without cpu experts for graph replay "
                "(--backends routed_experts=uva)")
        staged = []
        for name, t in (("hidden", hidden), ("index", index), ("weights", weights)):
            host = self.staging.take(name, tuple(t.shape), t.dtype)
            host.copy_(t, non_blocking=cuda)
            staged.append(host)
        if not cuda:
            return (*staged, None)
        stream = torch.cuda.current_stream(self.device)
        if self.staged is not None:
            count = self.staged.next()
            self.staged.write(count, stream)
            return (*staged, count)
        event = torch.cuda.Event()
        event.record(stream)
        return (*staged, event)

    def _rows_buffer(self, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The layer's host buffer for the rows the host writes ([T·k, H] of ``rows_dtype``)."""
        return self.staging.take("rows", (index.numel(), hidden.shape[-1]), rows_dtype(hidden, weights))

    def _compute(self, host: _Part, hidden, index, weights, out: torch.Tensor) -> bool:
        """The rows of the host's experts in ``host`` into ``out`` (zeroed first); False when no pair is routed to
        them."""
        out.zero_()
        return host_rows(self.module, host.layout, host.weights, host.table, hidden, index, weights, out)

    def _rows_back(self, out: torch.Tensor) -> torch.Tensor:
        """The rows on the compute device: copied after the stream's earlier work from the layer's buffer (a copy
        of it on the CPU, whose buffer the next call writes)."""
        return out.to(self.device, non_blocking=True) if self.device.type == "cuda" else out.clone()

    def _host_rows(self, host: _Part, hidden, index, weights, event) -> torch.Tensor | None:
        if event is not None:
            event.synchronize()  # the copies have landed; the GPU runs its parts meanwhile
        out = self._rows_buffer(hidden, index, weights)
        return self._rows_back(out) if self._compute(host, hidden, index, weights, out) else None

    def _host_async(self, host: _Part, hidden, index, weights, staged: int | None) -> torch.Tensor:
        """Step 3 on the host's thread: the stream waits for the flag, then copies the rows the thread wrote. The
        thread makes no CUDA call: it reads the count the stream writes (``staged``) and writes host memory; in a
        call the guard measures it reports its own time."""
        out = self._rows_buffer(hidden, index, weights)
        count = self.flag.next()
        inference = torch.is_inference_mode_enabled()
        timed = self.guard if self.guard is not None and self.guard.measuring else None

        def job() -> None:
            try:
                if staged is not None:
                    self.staged.host_wait(staged)
                start = time.perf_counter()
                with torch.inference_mode(inference), torch.no_grad():
                    self._compute(host, hidden, index, weights, out)
                if timed is not None:
                    timed.host_done((time.perf_counter() - start) * 1e3)
            except BaseException as exc:  # noqa: BLE001 - raised by the next call; the stream must go on
                out.zero_()
                if self.worker.error is None:
                    self.worker.error = exc
            finally:
                self.flag.raise_to(count)

        self.worker.submit(job)
        self.flag.wait(count, torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None)
        return self._rows_back(out)


@dataclass(eq=False)
class _SplitParam:
    """One split param: where it was and where each place's slice is."""

    ref: TensorRef
    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    ids: dict[str, list[int]]  # place -> global expert ids, in the order of its slices
    slices: dict[str, torch.Tensor]  # place -> [n, ...]: on the compute device (gpu) or in host memory
    flipped: frozenset[str] = frozenset()  # places whose slices are stored with the last two dims swapped
    swapped: bool = False  # .data points at the placeholder

    def assemble(self, device: torch.device) -> torch.Tensor:
        full = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)
        for place, ids in self.ids.items():
            if ids:
                part = self.slices[place]
                part = part.transpose(-2, -1) if place in self.flipped else part
                full[torch.tensor(ids, dtype=torch.long, device=device)] = part.to(device)
        return full


@dataclass(eq=False)
class ExpertSplits:
    """Every split layer of one applied plan: its params' slices, host arenas and replaced forwards."""

    device: torch.device
    params: list[_SplitParam] = field(default_factory=list)
    arenas: list[HostArena] = field(default_factory=list)
    # (module, its own forward attribute, the SplitForward that replaced it)
    forwards: list[tuple[nn.Module, object, SplitForward]] = field(default_factory=list)
    threads: int | None = None  # torch's intra-op threads before apply, when the host computes experts
    host_threads: int | None = None  # the threads to use then (None: every CPU of the process's affinity)
    guarded: bool = True  # on a GPU, split layers get a HostGuard (apply's host_levels; runtime/host_guard.py)
    pool: GraphPool | None = None  # level 0's eager decode calls replay CUDA graphs of this pool (apply's, on a GPU
    # with expert_graphs; runtime/shape_graphs.py: the applied plan's, which lets them go at remove())
    worker: HostWorker | None = None
    stagings: list[_Staging] = field(default_factory=list)  # each split layer's host buffers
    guards: list[HostGuard] = field(default_factory=list)  # each split layer's watch on its host part

    def host_levels(self) -> dict[str, dict[str, int]]:
        """Per split layer with a guard: the plan's host experts, the host's now, and the calls with fewer
        (``HostGuard.summary``)."""
        return {g.name: g.summary() for g in self.guards}

    def build(self, plan: Plan, model: nn.Module, pin: bool) -> None:
        """Split every layer with ``experts`` (``split_problems`` found nothing). On failure what was done stays
        recorded, and ``restore`` undoes it."""
        for layer in plan.layers:
            if layer.experts is not None:
                self._split_layer(layer, model, pin)
        if any(layer.experts is not None and layer.experts.cpu for layer in plan.layers):
            host_matmul.library()  # built (or loaded) now, not in the first forward's host part (a second or two)
            self.threads = torch.get_num_threads()
            # the issuing thread computes the host's part itself, or, where the host's thread does, keeps one CPU
            # for issuing (its own torch work stays small; a team of its own would contend with the host's)
            torch.set_num_threads(1 if self.worker is not None else self.host_threads or host_threads())

    def _worker(self) -> HostWorker | None:
        """The host's thread, made once, where the device's streams can wait on host flags (else None)."""
        if self.worker is None and flag_waits(self.device):
            self.worker = HostWorker(self.host_threads or max(1, host_threads() - 1))
        return self.worker

    def _split_layer(self, layer: PlanLayer, model: nn.Module, pin: bool) -> None:
        split = layer.experts
        experts = layer.moe.experts
        parent, attrs = _module_path(split.params)
        module = model.get_submodule(f"{layer.name}.{parent}" if parent else layer.name)
        ids = {"gpu": list(split.gpu), "uva": list(split.uva), "cpu": list(split.cpu)}
        layout = Layout.of(module)
        host_ids = ids["uva"] + ids["cpu"]  # one array in host memory: the uva experts, then the cpu experts
        host_layout = layout.for_host() if ids["cpu"] else layout  # the array's: as the host reads it, if it computes
        flip = layout.flipped(host_layout)  # the weights the array stores transposed
        made, arrays = [], {}
        for rel, attr in zip(split.params, attrs):
            ref = resolve(model, layer.name, rel)
            t = ref.local.data
            slices = {}
            if ids["gpu"]:
                slices["gpu"] = t[torch.tensor(ids["gpu"], device=t.device)].to(self.device)
            flipped = frozenset(p for p in ("uva", "cpu") if ids[p] and attr in flip)
            if host_ids:
                x = t[torch.tensor(host_ids, device=t.device)]
                arena, (array,) = pack([x.transpose(-2, -1).contiguous() if flipped else x], pin)
                self.arenas.append(arena)
                arrays[attr] = array
                slices |= {p: v for p, v in (("uva", array[:len(ids["uva"])]), ("cpu", array[len(ids["uva"]):]))
                           if ids[p]}
            sp = _SplitParam(ref, t.shape, t.stride(), t.dtype, t.device, ids, slices, flipped)
            self.params.append(sp)
            made.append(sp)
        for sp in made:  # every slice is made: now the params give up their own storage
            sp.ref.local.data = torch.empty(0, dtype=sp.dtype, device=self.device)
            sp.swapped = True
        place = expert_places(host_ids, ids["gpu"], experts)
        uva = {a: device_view(w, self.device) for a, w in arrays.items()} if self.device.type == "cuda" else dict(arrays)
        gpu = {a: sp.slices["gpu"] for a, sp in zip(attrs, made)} if ids["gpu"] else None
        placement = _Placement(host_ids, len(ids["cpu"]), host_layout, layout, arrays, uva, gpu, place.to(self.device),
                               place)
        self._install(module, layer, placement, ids)

    def _install(self, module: nn.Module, layer: PlanLayer, placement: _Placement, ids: dict[str, list[int]]) -> None:
        split = layer.experts
        cuda = self.device.type == "cuda"
        for level in {0, placement.planned}:  # the levels a call takes without the guard: made here
            placement.at(level)
        guard = None
        worker = self._worker() if ids["cpu"] else None
        if ids["cpu"]:
            marks = new_marks(self.device) if worker is not None and ids["uva"] and self.guarded else None
            if marks is not None:
                guard = HostGuard(layer.name, len(ids["cpu"]), len(ids["uva"]), marks)
                self.guards.append(guard)
        staging = _Staging(pin=cuda)
        self.stagings.append(staging)
        forward = SplitForward(module, placement.layout, self.device, placement, split, worker,
                               new_flag(self.device) if worker is not None else None,
                               HostFlag() if worker is not None and cuda else None, staging, guard=guard)
        if self.pool is not None and not offloaded_beside(layer):
            forward.graphs = self.pool.wrap(forward.gpu_rows, f"{layer.name}'s experts")
        self.forwards.append((module, module.__dict__.get("forward", _ABSENT), forward))
        module.forward = torch.compiler.disable(forward) if ids["cpu"] else forward

    def restore(self) -> list[str]:
        """Every split param back in one tensor of its own shape, stride, dtype and device (bit-identical), the
        experts modules' own forwards back, the host memory released. Returns what could not be done."""
        problems: list[str] = []
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        while self.forwards:
            module, previous, _ = self.forwards.pop()  # (their graphs are the pool's: apply lets go of them)
            if previous is _ABSENT:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
        for sp in self.params:
            if not sp.swapped:
                continue
            try:
                sp.ref.local.data = sp.assemble(sp.device)
                sp.swapped = False
            except Exception as exc:  # noqa: BLE001 - reported after every param had its turn
                problems.append(f"{sp.ref.full.lstrip('.')}: could not be put back together: {exc}")
        if problems:
            return problems
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        while self.stagings:
            self.stagings.pop().release()
        self.guards.clear()
        while self.arenas:
            self.arenas.pop().close()
        self.params.clear()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
            self.threads = None
        return []

    def attach(self, gate: ForwardGate | None) -> None:
        """Give every split layer the applied plan's gate (made by the offloader after the splits)."""
        for _, _, forward in self.forwards:
            forward.gate = gate

    def true_values(self) -> dict[int, Callable[[], torch.Tensor]]:
        """id(param) -> a function assembling its value in host memory (for state_dict while applied)."""
        return {id(sp.ref.tensor): (lambda sp=sp: sp.assemble(torch.device("cpu"))) for sp in self.params if sp.swapped}


def split_gpu_bytes(plan: Plan) -> int:
    """GPU bytes of the gpu experts' slices (resident in the plan, not resident params of the model)."""
    total = 0
    for layer in plan.layers:
        if layer.experts is not None and layer.moe is not None:
            for rel in layer.experts.params:
                p = layer.params[rel]
                total += p.bytes - host_bytes(p.bytes, layer.moe.experts, layer.experts)
    return total


class CpuOffloader(UvaOffloader):
    """Backend ``cpu`` (and ``mixed`` without prefetched params): the params on UVA read in place; the
    experts split by expert are ``ExpertSplits``'. With experts on the host, one forward at a time
    (runtime/forward_gate.py): a split layer's host buffers are rewritten at every call."""

    name = "cpu"

    def wrap_modules(self) -> None:
        if any(layer.experts is not None and layer.experts.cpu for layer in self.plan.layers):
            self.gate = ForwardGate(type(self.model).__name__)
            self.gate.install(self.model, self.hooks, callers(
                self.model, [layer.name for layer in self.plan.layers if layer.experts is not None]))
