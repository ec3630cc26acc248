"""Which params vLLM offloads for a set of flags: vLLM's own selection rules, restated.

Both offloaders see only the decoder layers that ``make_layers`` builds (this planner's block
stack), in order (vllm/model_executor/models/utils.py ``make_layers``; vllm/model_executor/
offloader/base.py: "wrap_modules is only called from make_layers"). The embedding, the final
norm and the LM head are never offloaded. Each layer's params are vLLM's (planner/vllm/layout.py).

- Prefetch (vllm/model_executor/offloader/prefetch.py, ``PrefetchOffloader.wrap_modules``):
  stack layer ``i`` is a candidate iff ``i % G >= G - K``: the *last* K of every group of G
  (G=8, K=2: layers 6, 7, 14, 15, ...). Of a candidate, every param is offloaded, or with
  ``--offload-params`` those whose name holds a listed segment as whole dotted segments
  (``f".{seg}." in f".{name}."``); a candidate with no such param is skipped and takes no slot.
  Slot of the j-th offloaded layer: ``j % S`` with S = ``--offload-prefetch-step`` buffer slots
  (this planner's prefetch_step, plan_version 2).
- Prefetch at run time (vllm/model_executor/offloader/prefetch.py and runtime.py, read at ``VLLM_READ``):
  the pool (``StaticBufferPool``) holds a buffer for every unique (name, shape, stride, dtype) key in
  each of the S slots; after a layer runs, the next layer of *its* slot is copied
  (``PrefetchRuntimeController._build_prefetch_after``), and a slot holding one layer is never refilled
  (``if len(units_in_slot) <= 1: continue``). Earlier vLLM refilled layer ``(j + S) % N`` after layer j
  (so a lone layer was copied again every forward, and for N not a multiple of S a slot could be
  overwritten before its layer ran; fixed by vllm-project/vllm#54975).
- UVA (vllm/model_executor/offloader/uva.py, ``UVAOffloader._maybe_offload_to_cpu``): walking the
  layers in order and each layer's params in order, a param (matching ``--cpu-offload-params``
  when given; others are passed over) is offloaded whole while the bytes offloaded so far are
  below ``int(cpu_offload_gb * 1024**3)``; so the param that crosses the limit is offloaded too,
  layers may end half offloaded, and everything after stays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.vllm.flags import VllmFlags
from planner.vllm.layout import VllmParam, matches

VLLM_READ = "vllm-project/vllm commit 9f4ce6b (September 2026)"  # the vLLM whose offloader the plans follow


@dataclass(frozen=True)
class StackLayer:
    """A block-stack layer as vLLM sees it."""

    name: str
    params: tuple[VllmParam, ...]


@dataclass(frozen=True)
class Selection:
    """What vLLM offloads: per layer name (stack order), the vLLM params offloaded."""

    mode: str  # prefetch, uva or none
    chosen: dict[str, tuple[VllmParam, ...]]
    candidates: tuple[str, ...] = ()  # prefetch: the layers the group rule picks (before --offload-params)

    @property
    def offloaded_bytes(self) -> int:
        return sum(p.nbytes for params in self.chosen.values() for p in params)

    def where(self) -> dict[str, dict[str, str]]:
        """The spec params offloaded, as ``planner.assemble.Assignment.where``."""
        backend = "uva" if self.mode == "uva" else "prefetch"
        return {layer: {m: backend for p in params for m in p.members} for layer, params in self.chosen.items()}


def group_picks(num_layers: int, group_size: int, num_in_group: int) -> list[int]:
    """vLLM's group rule: stack index i is a candidate iff i % G >= G - K (the last K of each group)."""
    from planner.layers import group_rule

    return group_rule(num_layers, group_size, num_in_group)


def select(stack: Sequence[StackLayer], flags: VllmFlags) -> Selection:
    if flags.mode == "prefetch":
        return _prefetch(stack, flags.group_size, flags.num_in_group, flags.offload_params)
    if flags.mode == "uva":
        return _uva(stack, flags.uva_max_bytes, flags.cpu_offload_params)
    return Selection("none", {})


def _prefetch(stack: Sequence[StackLayer], g: int, k: int, segments: Sequence[str]) -> Selection:
    picks = [stack[i] for i in group_picks(len(stack), g, k)]
    chosen = {}
    for layer in picks:
        mine = tuple(p for p in layer.params if not segments or matches(p.name, segments))
        if mine:
            chosen[layer.name] = mine
    return Selection("prefetch", chosen, tuple(layer.name for layer in picks))


def _uva(stack: Sequence[StackLayer], max_bytes: int, segments: Sequence[str]) -> Selection:
    total = 0
    chosen: dict[str, tuple[VllmParam, ...]] = {}
    for layer in stack:
        if total >= max_bytes:
            break
        mine = []
        for p in _eligible(layer, segments):
            if total >= max_bytes:
                break
            mine.append(p)
            total += p.nbytes
        if mine:
            chosen[layer.name] = tuple(mine)
    return Selection("uva", chosen)


def split_layer(stack: Sequence[StackLayer], chosen: Selection, flags: VllmFlags) -> tuple[int, int] | None:
    """UVA: (stack index, bytes offloaded of it) of the layer the byte limit cuts inside (some of its eligible
    params offloaded, not all), whose part depends on the order the module registers its params; None when
    the limit falls between layers."""
    if chosen.mode != "uva" or not chosen.chosen:
        return None
    index = {layer.name: i for i, layer in enumerate(stack)}
    last = max(chosen.chosen, key=index.__getitem__)
    eligible = _eligible(stack[index[last]], flags.cpu_offload_params)
    taken = sum(p.nbytes for p in chosen.chosen[last])
    return (index[last], taken) if taken < sum(p.nbytes for p in eligible) else None


def layer_limits(stack: Sequence[StackLayer], flags: VllmFlags, at: int) -> tuple[tuple[int, int] | None, tuple[int, int]]:
    """Byte limits (low, high: any limit L with low < L <= high) that end --cpu-offload-gb's walk exactly after
    stack layer ``at - 1`` (None for the first layer) and after layer ``at``, whatever the order of each
    layer's params: the walk stops at the first param that reaches L, so L must exceed the bytes before any
    of the layer's params could come last."""
    def limits(i: int) -> tuple[int, int]:
        through = sum(p.nbytes for layer in stack[:i + 1] for p in _eligible(layer, flags.cpu_offload_params))
        smallest = min(p.nbytes for p in _eligible(stack[i], flags.cpu_offload_params))
        return through - smallest, through

    before = next((limits(i) for i in range(at - 1, -1, -1) if _eligible(stack[i], flags.cpu_offload_params)), None)
    return before, limits(at)


def _eligible(layer: StackLayer, segments: Sequence[str]) -> list[VllmParam]:
    return [p for p in layer.params if not segments or matches(p.name, segments)]
