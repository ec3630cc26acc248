"""A function of a few tensors replayed from CUDA graphs, one per input shape: the eager path without its launches.

At decode shapes an eager forward is the host's Python and kernel launches, not the GPU's work: on the H200 the
Qwen3-MoE shape with hot experts resident and the rest read through UVA took 29.5 ms a batch-1 step eager and 13.6
in graph replay (docs/BENCHMARKS.md, 2026-12-03), the resident model itself 29.5 eager. A split layer's GPU experts
(``runtime.expert_math.parts_rows``: sort, count, gather, two grouped matmuls a part, weighting, scatter), and
transformers' grouped experts module (runtime/experts_forward.py), are some 25-50 launches that read no value back,
so an eager call of them can be one graph replay: ``ShapeGraphs`` wraps such a
function and, at the second eager call with a given set of input shapes and dtypes (the first is its warm-up),
captures it on a side stream into a graph whose inputs are static buffers; that call and every later one with those
shapes copy the inputs in, replay on the caller's stream and return a copy of the output (one launch each: the
graph's own output is rewritten at its next replay, and the caller may keep what it was given). Measured on the H200
(docs/BENCHMARKS.md, 2026-12-03 13:41 and 15:00 UTC): one split layer's call took the issuing thread 366-787 us
launched and 36-61 us from its graph, an experts module read through UVA 903-3,531 us and 42-73; the hot plan's
eager step went from 0.87-1.38x the all-UVA plan's to 0.60-0.72x, the all-UVA plan's own to 0.72-0.98x of it.

What it holds to:
- Only where capture can be right: a CUDA device, no autograd (``torch.is_grad_enabled()`` off, as in generate()),
  not while dynamo traces (compiled code is its own business) and not inside another capture (a whole-model graph
  captures the function's kernels itself). Otherwise, and above ``max_tokens`` rows (a prefill), the function runs
  as it is. The wrapped function must read no value back and must take its other tensors (weights, tables) from
  addresses that do not move while it is wrapped: a split layer's slices are made at apply and kept to remove.
- Replays give the eager call's values bit for bit: the same kernels on the same shapes (tests/test_cpu_experts_gpu.py).
- Memory: the graphs of one applied plan share one pool (``GraphPool``) and, for each input shape, one set of
  static inputs and one output (each graph copies its result into the shared output as its last kernel, so its
  own output's memory is the pool's again); the intermediates of one capture are reused by the next (no replay
  runs beside another: below). At most ``GRAPHED_MAX_SHAPES`` (8) input shapes a pool (a call of a further shape
  runs as launched), so what the graphs hold does not grow with the layers: at most 8 shapes' static tensors
  (schemas/expert_graphs.py ``static_bytes``: 0.52 MB at 64 tokens of the Qwen3-MoE shape) and the pool's
  segments, which the plan counts (``memory.graph_bytes``, planner/memory/graphs.py). Measured on the H200 for
  the Qwen3-MoE shape after batches of 1 to 64 tokens (docs/BENCHMARKS.md, "The layer graphs' memory"): the pool
  26 MiB, the static tensors 1.4 MB, against 32.0 MiB counted (8 KB and 2 MiB after batches of one token).
  ``GraphPool.counts()`` (in ``Handle.stats()["expert_graphs"]``) says what the static tensors hold (``bytes``)
  and the pool's segments (``pool_bytes``).
  ``close`` lets go of every graph (after the device has run its replays; remove() calls it once the forwards
  are restored).
- A capture that fails (an op CUDA graphs refuse) leaves the function eager from then on, with a warning naming it.
- Replays of one pool's graphs run one after another (``GraphPool``: they share intermediates and rewrite their
  own inputs and output): a second thread meanwhile runs its call as launched, and a replay on another stream than
  the pool's last waits for that stream first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from schemas.expert_graphs import GRAPHED_MAX_SHAPES, GRAPHED_MAX_TOKENS
from schemas.measured import MeasuredGraphs

log = logging.getLogger(__name__)

MAX_TOKENS = GRAPHED_MAX_TOKENS  # calls of at most this many rows (tokens) are graphed (the planner prices them)


def graphs_here(device: torch.device) -> bool:
    """Whether calls on ``device`` can replay CUDA graphs."""
    return device.type == "cuda"


Key = tuple[tuple[tuple[int, ...], torch.dtype], ...]


def key_of(tensors: tuple[torch.Tensor, ...]) -> Key:
    """The shapes and dtypes of a call's inputs (or of an output): one graph each, one set of static tensors."""
    return tuple((tuple(t.shape), t.dtype) for t in tensors)


@dataclass(eq=False)
class GraphPool:
    """The memory pool and capture stream the graphs of one applied plan share, made at the first capture, and
    what keeps their replays one after another: graphs captured into one pool reuse each other's intermediates, and
    each graph rewrites its own static inputs and output, so a replay must not run beside another replay of the
    pool's. ``turn`` is taken around a call's copies, replay and output copy (a thread finding it taken runs its
    call as launched instead), and ``order`` makes the caller's stream wait for the stream of the pool's last
    replay when they differ (two streams of one thread, or two threads on their own streams)."""

    device: torch.device
    handle: object = None
    stream: torch.cuda.Stream | None = None
    turn: threading.Lock = field(default_factory=threading.Lock)
    last: torch.cuda.Stream | None = None  # the stream of the pool's last replay or capture
    members: list[ShapeGraphs] = field(default_factory=list)  # the functions wrapped with this pool (``wrap``)
    max_shapes: int = GRAPHED_MAX_SHAPES  # input shapes the pool's graphs are captured for; others run as launched
    # the inputs every graph of a shape reads, and the output every graph of a result's shape writes
    statics: dict[Key, tuple[torch.Tensor, ...]] = field(default_factory=dict)
    outputs: dict[Key, torch.Tensor] = field(default_factory=dict)

    def wrap(self, fn: Callable[..., torch.Tensor], name: str,
             stamp: Callable[[], tuple] | None = None) -> ShapeGraphs:
        """``fn`` replayed from graphs of this pool (``ShapeGraphs``; ``stamp``: its ``stamp``)."""
        graphs = ShapeGraphs(fn, name, self, stamp=stamp)
        self.members.append(graphs)
        return graphs

    def counts(self) -> dict[str, int]:
        """The functions wrapped, the graphs they hold, those whose capture failed, the bytes their static inputs and
        outputs hold (``bytes``) and the bytes the allocator keeps in the pool's segments (``pool_bytes``: the
        graphs' intermediates, reserved for them alone)."""
        return MeasuredGraphs(  # the stats file's record of them (schemas/measured.py)
            layers=len(self.members), graphs=sum(len(g.graphs) for g in self.members),
            failed=sum(g.failed is not None for g in self.members),
            bytes=sum(t.nbytes for ts in (*self.statics.values(), tuple(self.outputs.values())) for t in ts),
            pool_bytes=self.pool_bytes()).model_dump()

    def pool_bytes(self) -> int:
        """The bytes of the segments PyTorch's allocator holds in the pool (0 before its first capture)."""
        if self.handle is None:
            return 0
        pool = tuple(self.handle)
        return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == pool)

    def room(self, key: Key) -> bool:
        """Whether a graph of inputs ``key`` may be captured: the pool holds that shape's static inputs, or
        fewer than ``max_shapes`` shapes'."""
        return key in self.statics or len(self.statics) < self.max_shapes

    def static_inputs(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The static inputs every graph of ``inputs``' shapes reads, made at the first (plain tensors, written
        under no_grad and inference_mode alike; outside the graphs' pool, which their captures reuse)."""
        key = key_of(inputs)
        if key not in self.statics:
            with torch.inference_mode(False):
                self.statics[key] = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in inputs)
        return self.statics[key]

    def static_output(self, like: torch.Tensor) -> torch.Tensor:
        """The output every graph whose result is shaped as ``like`` copies it into."""
        key = key_of((like,))
        if key not in self.outputs:
            with torch.inference_mode(False):
                self.outputs[key] = torch.empty(like.shape, dtype=like.dtype, device=like.device)
        return self.outputs[key]

    def close(self) -> None:
        """Let go of every graph of the pool, after the device has run its replays (the functions stay wrapped:
        a later call captures again)."""
        if self.device.type == "cuda" and any(g.graphs for g in self.members):
            torch.cuda.synchronize(self.device)
        for graphs in self.members:
            graphs.close()
        self.statics.clear()
        self.outputs.clear()

    def ready(self) -> tuple[object, torch.cuda.Stream]:
        if self.handle is None:
            self.handle = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream(self.device)
        return self.handle, self.stream

    def order(self) -> None:
        """The caller's stream after the pool's last replay (held ``turn``)."""
        current = torch.cuda.current_stream(self.device)
        if self.last is not None and self.last != current:
            current.wait_stream(self.last)
        self.last = current


@dataclass(eq=False)
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # the pool's static inputs of the shape
    output: torch.Tensor  # the pool's static output the graph copies its result into


@dataclass(eq=False)
class ShapeGraphs:
    """``fn(*tensors) -> tensor`` replayed from one CUDA graph per input shape (the module docstring)."""

    fn: Callable[..., torch.Tensor]
    name: str  # what the function is, for the warning when a capture fails
    pool: GraphPool
    max_tokens: int = MAX_TOKENS
    # where the tensors ``fn`` reads besides its inputs are (their addresses): should they differ from the
    # captures', the function runs eagerly from then on (None: they cannot move while wrapped)
    stamp: Callable[[], tuple] | None = None
    stamped: tuple | None = None  # ``stamp()`` at the first capture
    graphs: dict[Key, _Graph] = field(default_factory=dict)
    seen: set[Key] = field(default_factory=set)  # shapes called once (their warm-up done)
    failed: str | None = None  # why a capture failed (or the tensors moved): the function is eager from then on

    def applies(self, first: torch.Tensor) -> bool:
        """Whether a call whose first input is ``first`` may replay a graph (the module docstring's conditions)."""
        return (self.failed is None and graphs_here(first.device) and first.shape[0] <= self.max_tokens
                and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
                and not (first.device.type == "cuda" and torch.cuda.is_current_stream_capturing()))

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if not self.applies(inputs[0]):
            return self.fn(*inputs)
        if self.graphs and self.stamp is not None and self.stamp() != self.stamped:
            self.failed = "the tensors it reads moved since its graphs were captured"
            log.warning("%s: runs eagerly from now on (%s)", self.name, self.failed)
            return self.fn(*inputs)
        key = key_of(inputs)
        entry = self.graphs.get(key)
        if entry is None and (key not in self.seen or not self.pool.room(key)):
            self.seen.add(key)
            return self.fn(*inputs)
        if not self.pool.turn.acquire(blocking=False):  # another thread is replaying one of the pool's graphs
            return self.fn(*inputs)
        try:
            self.pool.order()
            if entry is None:
                entry = self._capture(key, inputs)
                if entry is None:
                    return self.fn(*inputs)
            for static, t in zip(entry.inputs, inputs):
                static.copy_(t)
            entry.graph.replay()
            return entry.output.clone()
        finally:
            self.pool.turn.release()

    def _capture(self, key: Key, inputs: tuple[torch.Tensor, ...]) -> _Graph | None:
        static = self.pool.static_inputs(inputs)
        for s, t in zip(static, inputs):
            s.copy_(t)
        try:
            entry = self._captured(static)
        except Exception as exc:  # noqa: BLE001 - the function stays eager; this call runs it so
            self.failed = f"{type(exc).__name__}: {exc}"
            log.warning("%s: not captured in a CUDA graph, runs eagerly from now on (%s)", self.name, self.failed)
            return None
        if not self.graphs and self.stamp is not None:
            self.stamped = self.stamp()
        self.graphs[key] = entry
        return entry

    def _captured(self, static: tuple[torch.Tensor, ...]) -> _Graph:
        """``fn`` captured on the pool's stream over the pool's ``static`` inputs (holding the call's values),
        after a warm-up there, its result copied into the pool's static output of its shape."""
        handle, stream = self.pool.ready()
        caller = torch.cuda.current_stream(static[0].device)
        stream.wait_stream(caller)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(stream), torch.no_grad():
                output = self.pool.static_output(self.fn(*static))  # the warm-up (lazy handles, workspaces)
                graph.capture_begin(pool=handle, capture_error_mode="thread_local")
                try:
                    output.copy_(self.fn(*static))  # the graph's own result goes back to the pool once captured
                finally:
                    graph.capture_end()
        finally:
            caller.wait_stream(stream)
        return _Graph(graph, static, output)

    def close(self) -> None:
        """Let go of every graph (the device synchronized first: a replay may be running)."""
        self.graphs.clear()
        self.seen.clear()
