"""What a layer whose routed experts are split by expert costs (schemas/plan_experts.py): gpu, uva and cpu parts.

A split layer runs its other params as any layer does (planner/cost/layer.py); its experts run in parts:

- gpu experts: a grouped matmul over the touched ones, from GPU memory (its flops at ``expert_tflops_rows`` by the
  rows an expert sees, its bytes at ``expert_gbps``);
- uva experts: the same, their bytes read over the host link (``expert_passes`` re-reads, by tiles of rows for a
  skewed routing: planner/cost/expert_reads.py; ``uva_expert_call_ms``);
- cpu experts: the host CPU's padded pass (runtime/expert_math.py) reads the touched experts' bytes at
  ``host_gbps(rows)`` (times ``host_link_share`` while the link reads host memory for this layer's uva
  experts) plus ``host_expert_us_at(rows)`` a touched expert, or computes at ``host_tflops`` when that is slower, plus
  ``host_call_us``; the routed tokens'
  hidden states go to the host and the experts' rows (T·k of them) come back over the link.

The runtime gives the host's part to a thread of its own and makes the stream wait for it (runtime/cpu_experts.py,
runtime/stream_wait.py): the host starts when the stream has run the layer's own kernels (the copies to the host
follow them), computes while the GPU runs its parts, and the layer ends when both have finished; the thread that
issues the forward does not wait, so the next layers' issue time overlaps the host's part
(``LayerWork.host_ms`` / ``beside_ms``: planner/cost/timeline.py). The split that makes a layer fastest makes the
host and the GPU's parts finish together. Above ``cpu_max_tokens`` tokens the cpu experts are read through UVA
by the GPU instead. Routing is uniform (each expert picked by a token with chance k/E) unless measured routing
gives each expert its own chance (``shares``: planner/strategy/experts.py, schemas/routing.py).

In an eager call of at most ``GRAPHED_MAX_TOKENS`` tokens whose experts GPU kernels compute all (no host part), the
runtime replays the experts from a CUDA graph (runtime/shape_graphs.py): the layer issues the graph's few launches
where the module's call and its parts' extra launches were (``schemas.expert_graphs.graphed``;
planner/cost/layer.py ``graphed_issue_us``). That is in a plan applied with the layer graphs (``graphs``: what the
plan's memory section says, ``schemas.expert_graphs.graphs_on``); a plan made with the spec's ``memory.graphs: 0``
runs without them, and every such call is priced as launched: the module's call and its parts' launches.

Where the host's part would take longer than the GPU reading every host-memory expert (a plan made for decode 32,
at batch 1), the runtime's guard sends them all through UVA (runtime/host_guard.py): such a call is priced as that
level 0 (``bypassed``), graphed as above. The planner assumes ``apply``'s defaults (``host_levels`` on, and
``expert_graphs`` as the plan's memory counts the layer graphs).

CUDA graph replay cannot capture the host's part: a workload in mode graph is predicted as if the host part
ran between captured graphs (torch.compile without CUDA graphs); the runtime refuses the capture.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.cost.block import ONE, Sequences
from planner.cost.expert_reads import touched_by, uva_passes
from planner.cost.layer import LayerWork, graphed_issue_us, layer_work
from schemas.hardware import HardwareProfile
from schemas.plan_content import PlanLayer
from schemas.expert_graphs import graphed
from schemas.plan_experts import ExpertSplit, bypassed_host, host_computes
from schemas.spec_layers import moe_shape

# kernels a split forward issues beyond transformers' own grouped experts kernel (in the MoE block's CPU figure), as
# differences measured against it, not counts of a part's kernels: a GPU part after the first (runtime/expert_math.py
# parts_rows: the parts share one sort; on the H200 2,019 launches a decode step with two GPU parts in each of 24
# layers against the resident model's 1,947, and 2,523 when each part had a pass of its own, 2026-12-02); a pass of
# its own (the host's experts read through UVA above cpu_max_tokens); the host's part: its inputs' copies, the
# stream's count and wait, the rows' copy back and their add, and the hand-off's Python (not measured on its own:
# held at the 24 launches the model gave a UVA and a host part before the GPU parts shared a pass; decode steps at
# batch 1 with the host measured 0.77-1.04x their prediction with it)
GPU_PART_LAUNCHES = 3
OWN_PASS_LAUNCHES = 21
HOST_PART_LAUNCHES = 24
MAX_TOKENS_SEARCHED = 1 << 20


@dataclass(frozen=True)
class ExpertShape:
    """One expert of a split layer: its bytes, its params (elements), its output width and dtype size."""

    nbytes: int
    numel: int
    width: int  # the hidden size its output rows have
    itemsize: int
    top_k: int
    experts: int

    @classmethod
    def of(cls, layer: PlanLayer) -> ExpertShape:
        split, moe = layer.experts, layer.moe
        params = [layer.params[rel] for rel in split.params]
        nbytes = sum(p.bytes for p in params) // moe.experts
        numel = sum(math.prod(p.shape) for p in params) // moe.experts
        down = [layer.params[rel] for rel in split.params if rel.rpartition(".")[2] == "down_proj"]
        width = down[0].shape[1] if down and len(down[0].shape) == 3 else 0
        itemsize = max(1, params[0].bytes // max(1, math.prod(params[0].shape)))
        return cls(nbytes, numel, width, itemsize, moe.top_k, moe.experts)


def chances(split: ExpertSplit, shape: ExpertShape, shares: Sequence[float] | None) -> dict[str, list[float]]:
    """Per place, each of its experts' chance of being picked by one token."""
    uniform = shape.top_k / shape.experts
    return {place: [uniform if shares is None else shares[e] for e in getattr(split, place)]
            for place in ("gpu", "uva", "cpu")}


def _spread(q: Sequence[float], tokens: int) -> float:
    """The standard deviation of how many of the experts are touched (each touched on its own chance)."""
    return math.sqrt(sum(p * (1.0 - p) for p in (1.0 - (1.0 - min(x, 1.0)) ** tokens for x in q)))


def expected_max(a: float, sd_a: float, b: float, sd_b: float) -> float:
    """E[max(A, B)] of independent normal A and B (Clark, 1961): the layer's experts end when the slower of the
    host and the GPU's parts does, and with few tokens which one that is depends on the routing."""
    theta = math.hypot(sd_a, sd_b)
    if theta < 1e-12:
        return max(a, b)
    alpha = (a - b) / theta
    cdf = 0.5 * (1.0 + math.erf(alpha / math.sqrt(2.0)))
    pdf = math.exp(-0.5 * alpha * alpha) / math.sqrt(2.0 * math.pi)
    return a * cdf + b * (1.0 - cdf) + theta * pdf


def _uva_passes(q: Sequence[float], tokens: int, touched: float, rows: float, shape: ExpertShape,
                hw: HardwareProfile) -> float:
    """Reads of each of a part's ``touched`` UVA experts (``touched_by(q, tokens)``, with the ``rows`` they see in
    all), the part one grouped call of its own: planner/cost/expert_reads.py's ``uva_passes``."""
    return uva_passes(q, (shape.experts, shape.top_k), tokens, touched, rows / max(touched, 1e-9), hw, len(q))


def gpu_part_sd(q: Sequence[float], tokens: int, shape: ExpertShape, hw: HardwareProfile, uva: bool) -> float:
    """The spread of ``gpu_part_ms`` over routings: its touched experts' count's, at its rate per expert."""
    if not q:
        return 0.0
    rate = hw.uva_gbps / _uva_passes(q, tokens, *touched_by(q, tokens), shape, hw) if uva else hw.experts_gbps
    return _spread(q, tokens) * shape.nbytes / rate / 1e6


def gpu_part_ms(q: Sequence[float], tokens: int, shape: ExpertShape, hw: HardwareProfile, uva: bool,
                graphed: bool = False) -> float:
    """A GPU part: its touched experts from GPU memory, or over the link (``uva``: a fixed ``uva_expert_call_ms``
    a launched call, none in a ``graphed`` one, as planner/cost/layer.py ``placed_work`` says)."""
    if not q:
        return 0.0
    touched, rows = touched_by(q, tokens)
    flops = 2.0 * rows * shape.numel
    rate = hw.uva_gbps if uva else hw.experts_gbps
    passes = _uva_passes(q, tokens, touched, rows, shape, hw) if uva else 1.0
    fixed = hw.uva_expert_call_ms if uva and not graphed else 0.0
    tflops = hw.experts_tflops_at(rows / max(touched, 1e-9))
    return fixed + max(flops / (tflops * 1e9), touched * shape.nbytes * passes / rate / 1e6)


def gpu_parts_ms(q: dict[str, list[float]], on_host: bool, tokens: int, shape: ExpertShape,
                 hw: HardwareProfile, graphed: bool = False) -> float:
    """The GPU's parts of a split layer's experts (``q``: ``chances``): its gpu and uva experts, and where the host
    does not compute its cpu experts (``on_host``) those read through UVA in a grouped call of their own
    (runtime/cpu_experts.py SplitForward); ``graphed``: the call replays the layer's graph."""
    via_uva = [] if on_host else q["cpu"]
    return gpu_part_ms(q["gpu"], tokens, shape, hw, False) + gpu_part_ms(q["uva"], tokens, shape, hw, True, graphed) \
        + gpu_part_ms(via_uva, tokens, shape, hw, True, graphed)


def _host_expert_ms(q: Sequence[float], tokens: int, shape: ExpertShape, hw: HardwareProfile, link_busy: bool) -> float:
    """What one touched expert of the host's part costs: its own cost and its bytes at the host's rate, both at the
    rows a touched expert sees (the rate times ``host_link_share`` while the link reads this layer's uva experts)."""
    touched, rows = touched_by(q, tokens)
    each = rows / max(touched, 1e-9)
    rate = hw.host_gbps(each) * (hw.host_link_share if link_busy else 1.0)
    return hw.host_expert_us_at(each) / 1e3 + shape.nbytes / rate / 1e6


def host_part_ms(q: Sequence[float], tokens: int, shape: ExpertShape, hw: HardwareProfile, link_busy: bool) -> float:
    """The host's part: its touched experts' bytes or its flops, whichever takes longer, plus its fixed cost and
    the rows' trips over the link."""
    if not q:
        return 0.0
    touched, rows = touched_by(q, tokens)
    read = touched * _host_expert_ms(q, tokens, shape, hw, link_busy)
    compute = max(read, 2.0 * rows * shape.numel / (hw.host_tflops * 1e9))
    trips = tokens * shape.width * shape.itemsize * (1 + shape.top_k) / hw.h2d_gbps / 1e6
    return hw.host_call_us / 1e3 + compute + trips


def bypassed(q: dict[str, list[float]], tokens: int, shape: ExpertShape, hw: HardwareProfile) -> bool:
    """Whether the runtime's guard sends all of a split layer's host experts through UVA at calls of ``tokens``
    tokens (runtime/host_guard.py, with ``apply``'s default ``host_levels=True``; ``q``: ``chances``): the layer
    has uva experts beside its cpu experts (the guard measures the link by them) and the host's part takes longer
    than the GPU would take to read every one of its host-memory experts (at a few rows a call the host's fixed
    costs outweigh the experts it saves the link: a plan made for decode 32, at batch 1)."""
    if not (q["uva"] and q["cpu"]):
        return False
    return bypassed_host(host_part_ms(q["cpu"], tokens, shape, hw, True),
                         gpu_part_ms(q["uva"] + q["cpu"], tokens, shape, hw, True))


def through_uva(split: ExpertSplit) -> ExpertSplit:
    """``split`` with its cpu experts read through UVA (the guard's level 0)."""
    return split.model_copy(update={"uva": sorted([*split.uva, *split.cpu]), "cpu": [], "cpu_max_tokens": None})


def split_work(layer: PlanLayer, tokens: int, hw: HardwareProfile, shares: Sequence[float] | None = None,
               seqs: Sequences = ONE, graphs: bool = True) -> LayerWork:
    """The work of a layer with ``experts``: its other params as planner/cost/layer.py costs them (its attention
    over the context of ``seqs`` included), its parts as above, the host's part on its own thread beside the
    GPU's parts, joined at the layer's end; where the runtime's guard would send the host's experts through UVA
    (``bypassed``), the layer's work so. ``graphs``: the plan runs with the layer graphs (the module docstring)."""
    split = layer.experts
    shape = ExpertShape.of(layer)
    by_expert = set(split.params)
    rest = layer.model_copy(update={
        "params": {r: p for r, p in layer.params.items() if r not in by_expert},
        "offloaded": [r for r in layer.offloaded if r not in by_expert], "experts": None, "moe": None})
    base = layer_work(rest, tokens, hw, seqs, block_moe=moe_shape(layer.moe), graphs=graphs)  # an MoE block's floor
    q = chances(split, shape, shares)
    on_host = host_computes(split, tokens)
    if on_host and bypassed(q, tokens, shape, hw):
        return split_work(layer.model_copy(update={"experts": through_uva(split)}), tokens, hw, shares, seqs, graphs)
    replayed = graphs and not on_host and graphed(layer, tokens)
    parts_ms = gpu_parts_ms(q, on_host, tokens, shape, hw, replayed)
    gpu_parts = sum(1 for x in (q["gpu"], q["uva"]) if x)
    launches = max(0, gpu_parts - 1) * GPU_PART_LAUNCHES
    if q["cpu"]:
        launches += HOST_PART_LAUNCHES if on_host else OWN_PASS_LAUNCHES
    if replayed:  # the parts' launches are in the graph, the call replays it
        issue_ms = graphed_issue_us(hw.moe_block_cpu_us, hw) / 1e3
    else:
        issue_ms = (hw.moe_block_cpu_us + launches * hw.launch_us) / 1e3
    if not on_host:
        return LayerWork(base.gpu_ms + parts_ms, issue_ms, base.copy_ms, base.copy_bytes)
    host_ms = host_part_ms(q["cpu"], tokens, shape, hw, bool(q["uva"]))
    parts_sd = math.hypot(gpu_part_sd(q["gpu"], tokens, shape, hw, False), gpu_part_sd(q["uva"], tokens, shape, hw, True))
    host_sd = _spread(q["cpu"], tokens) * _host_expert_ms(q["cpu"], tokens, shape, hw, bool(q["uva"]))
    return LayerWork(base.gpu_ms + parts_ms, issue_ms, base.copy_ms, base.copy_bytes, host_ms=host_ms,
                     beside_ms=parts_ms, joined_ms=expected_max(parts_ms, parts_sd, host_ms, host_sd))


def _memory_bound(q: Sequence[float], tokens: int, shape: ExpertShape, hw: HardwareProfile) -> bool:
    """Whether the host reads its experts' bytes for longer than it computes on them at ``tokens``."""
    touched, rows = touched_by(q, tokens)
    return touched * shape.nbytes / hw.host_gbps(rows / max(touched, 1e-9)) / 1e6 >= \
        2.0 * rows * shape.numel / (hw.host_tflops * 1e9)


def cpu_max_tokens(layer: PlanLayer, hw: HardwareProfile, shares: Sequence[float] | None = None) -> int | None:
    """The most tokens at which the host computes the layer's cpu experts; above it the runtime sends them to the
    GPU through UVA (a prefill). Where the host is faster at one token: the most at which it is still no slower
    than UVA; else (the plan asks the host even so): the most at which the host is still bound by reading the
    experts rather than by its arithmetic, past which its time grows with every token. None: no limit."""
    shape = ExpertShape.of(layer)
    q = chances(layer.experts, shape, shares)["cpu"]
    if not q:
        return None
    busy = bool(layer.experts.uva)

    def faster(t: int) -> bool:
        return host_part_ms(q, t, shape, hw, busy) <= gpu_part_ms(q, t, shape, hw, True)

    keep = faster if faster(1) else (lambda t: _memory_bound(q, t, shape, hw))
    if not keep(1):
        return 1
    lo, hi = 1, 2
    while hi <= MAX_TOKENS_SEARCHED and keep(hi):
        lo, hi = hi, hi * 2
    if hi > MAX_TOKENS_SEARCHED:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if keep(mid) else (lo, mid)
    return lo
