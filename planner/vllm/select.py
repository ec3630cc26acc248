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
        for p in layer.params:
            if total >= max_bytes:
                break
            if segments and not matches(p.name, segments):
                continue
            mine.append(p)
            total += p.nbytes
        if mine:
            chosen[layer.name] = tuple(mine)
    return Selection("uva", chosen)
