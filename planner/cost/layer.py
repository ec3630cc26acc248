"""What one layer costs at T tokens: GPU time, CPU issue time and prefetch copy time.

A roofline per param, from the plan alone (shapes, dtypes, kinds, which params are offloaded
and how: a param in the layer's ``uva`` list is read over the host link, another offloaded param
is copied into a slot by the prefetch stream) and a hardware profile:

- a matrix (2-D or more) is a matmul: ``max(2·T·numel / matmul rate, bytes / memory rate)``, its memory rate
  ``matmul_gbps_at(T)`` (a decoder block's matmuls as calibrate replays them, slower the more rows; else
  ``gpu_mem_gbps``);
  through UVA the bytes come over the host link instead, read ``passes(T)`` times, and the matmul pays
  a fixed ``uva_call_ms`` besides (the read's ramp and tail, which a small matrix feels most);
- an embedding table is a lookup: T rows are read;
- a vector (norm weight, bias) or a quantization scale is read once;
- routed experts: a layer with ``moe`` (E experts, top-k) touches on average
  ``E·(1 - (1 - k/E)^T)`` experts at T tokens (uniform routing), so that share of the bytes
  is read, and ``2·T·k·numel/E`` flops are done; a prefetch copy still moves every expert. With
  measured routing (expert ``e`` picked by a token with chance ``q_e``) ``Σ 1 - (1 - q_e)^T`` are
  touched and ``T·Σ q_e`` rows computed.
  Read through UVA, a grouped expert matmul re-reads its experts ``expert_passes(rows an expert)`` times (with
  measured routing, by its tiles of rows: planner/cost/expert_reads.py) and pays a fixed ``uva_expert_call_ms``;
  its flops run at ``expert_tflops_rows`` by the rows each touched expert sees (grouped kernels over many small
  experts run below a dense matmul's rate, the more so the fewer rows an expert: on the H200 122 TFLOP/s at 128
  rows an expert, 199 at 2,048). From GPU memory it reads the touched experts at ``expert_gbps`` (a grouped
  kernel reads faster the more experts a batch touches: 1.7 TB/s at 8 and 2.9 at 115 on the H200; ``expert_gbps``
  is the rate between the two, and what a call pays beyond it, with the routing's small kernels, lies in the
  block floor ``moe_block_gpu_us``).

An eager experts call of an MoE block that may replay a layer graph (schemas/expert_graphs.py) issues the graph's
few launches instead of its own (``graphed_issue_us``) in a plan applied with the layer graphs (``graphs``: as the
plan's memory section says, ``schemas.expert_graphs.graphs_on``); in one without them (the spec's
``memory.graphs: 0``) every such call is priced as launched.

In CUDA graph replay (a workload's ``mode: graph``) the CPU issues nothing per kernel, nothing is read back
mid-layer and a UVA matmul pays no fixed time beyond its bytes: ``profile_for`` gives the profile with those
costs at zero.

CPU time (eager PyTorch): ``moe_block_cpu_us`` for an MoE block, ``block_cpu_us`` for
another decoder block (a layer with 4 or more matrices), ``launch_us`` per param for a small
layer, plus ``expert_cpu_us`` per touched expert (MoE blocks that loop over experts); the forward's own work
outside its layers (``model_cpu_us``: embedding, rotary tables, masks, head, output) is where the CPU's clock
starts. With ``moe_sync`` (transformers' eager MoE blocks) the CPU waits for the GPU before the expert loop, so
the experts' kernels start only after everything before them has run.
What the roofline of the matrices misses in a decoder block (attention's own arithmetic over the context,
norms and elementwise work) is added per block: planner/cost/block.py; so is the block's GPU floor
(``block_gpu_us`` / ``moe_block_gpu_us``: its many small kernels' fixed times, which a CUDA graph replay of a
decode step is made of besides the weights' reads; in eager runs the CPU's issue time usually hides it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from functools import lru_cache

from planner.cost.block import ONE, Sequences, block_ms, block_shape
from planner.cost.expert_reads import touched_by, touched_experts, uva_passes
from schemas.expert_graphs import GRAPHED_MAX_TOKENS, module_graphed, stacked_experts
from schemas.kinds import AFTER_ATTENTION, name_key, param_kind
from schemas.hardware_profile import HardwareProfile
from schemas.plan_content import PlanLayer, PlanParam
from schemas.spec_layers import Tensor, moe_shape

_HEADS = {"lm_head", "embed_out"}

# an eager experts call replayed from its CUDA graph (runtime/shape_graphs.py; schemas/expert_graphs.py): the
# launches it no longer issues (transformers' grouped experts call in the MoE block's CPU figure, and a split layer's
# parts beyond it, which the graph holds too) and those it issues instead (its inputs' copies, the replay, the
# output's copy), as launch-equivalents of the profile's ``launch_us``. Measured on the H200 (docs/BENCHMARKS.md
# 2026-12-03 13:41 UTC) on a host whose resident eager step is the bundled profile's (50.7 ms against 53.0
# predicted): a split layer's two GPU parts 460.5 us a call launched (49 of the profile's 9.34-us launches, of
# which 3 for the second part: planner/cost/host_experts.py GPU_PART_LAUNCHES), 38.1 from the graph (4)
EXPERTS_CALL_LAUNCHES = 46
GRAPH_CALL_LAUNCHES = 4


def graphed_issue_us(cpu_us: float, hw: HardwareProfile) -> float:
    """A block's host time ``cpu_us`` with its experts call replayed from a graph instead of launched."""
    return max(0.0, cpu_us + (GRAPH_CALL_LAUNCHES - EXPERTS_CALL_LAUNCHES) * hw.launch_us)


@dataclass(frozen=True, slots=True)
class LayerWork:
    gpu_ms: float  # compute stream: kernels, UVA reads included
    cpu_ms: float  # CPU time to issue the layer's kernels
    copy_ms: float  # copy stream: its prefetched params (0 when nothing is prefetched)
    copy_bytes: int
    # the part of gpu_ms / cpu_ms issued after the CPU waits for the GPU mid-layer (an eager MoE
    # block reads the routing back to loop over the experts it hit); None: no such wait
    synced_gpu_ms: float | None = None
    synced_cpu_ms: float = 0.0
    # the host link's time of the layer's UVA reads (their bytes at the UVA rate, re-reads included), and
    # the part of it read after the mid-layer wait: what the copy stream shares the link with
    uva_link_ms: float = 0.0
    synced_uva_link_ms: float = 0.0
    # when the layer's UVA reads begin, from its start: where every param read through UVA is of a kind that runs
    # after the block's attention (an MLP, experts), the layer's other work first (its attention, the block's own
    # kernels, the routing): a copy in flight has the link alone until then; else 0
    uva_at_ms: float = 0.0
    # the host CPU's own thread (the cpu backend's experts): it starts when the compute stream has run the
    # layer's gpu_ms less beside_ms, runs beside the stream's last beside_ms, and the stream waits for it at
    # the layer's end, joined_ms after it reached the experts (the expected larger of the two over routings);
    # the CPU issuing the forward does not wait for it
    host_ms: float = 0.0
    beside_ms: float = 0.0
    joined_ms: float = 0.0

    def alone_ms(self) -> float:
        """The layer's time by itself: its GPU work, with the mid-layer wait or the host's thread joined, or the
        CPU's issuing if longer."""
        if self.host_ms:
            gpu = self.gpu_ms - self.beside_ms + max(self.joined_ms, self.host_ms)
        elif self.synced_gpu_ms is not None:
            gpu = self.gpu_ms - self.synced_gpu_ms + max(self.synced_gpu_ms, self.synced_cpu_ms)
        else:
            gpu = self.gpu_ms
        return max(gpu, self.cpu_ms)


def profile_for(hw: HardwareProfile, mode: str) -> HardwareProfile:
    """``hw`` as a forward run in ``mode`` sees it: in CUDA graph replay no CPU issue time, no mid-layer
    read-back (a captured forward cannot wait on the CPU) and no fixed time per UVA matmul (``uva_call_ms``,
    ``uva_expert_call_ms``: calibrate measures them in eager calls; in replay the next kernel starts as the last
    ends, and predictions without them matched 24 of 27 and 36 of 41 graph-replayed plans within 10% on two H200
    runs, against 19 and 33 with them: docs/BENCHMARKS.md, 2026-12-02 06:45); eager: ``hw`` itself."""
    if mode == "eager":
        return hw
    return hw.model_copy(update={"launch_us": 0.0, "block_cpu_us": 0.0, "moe_block_cpu_us": 0.0, "model_cpu_us": 0.0,
                                 "expert_cpu_us": 0.0, "moe_sync": False, "uva_call_ms": 0.0,
                                 "uva_expert_call_ms": 0.0})


def reach(moe: tuple[int, int], tokens: float, shares: Sequence[float] | None = None) -> tuple[float, float]:
    """(experts expected to be touched, rows they see in all): uniform routing, or the measured ``shares``."""
    if shares is None:
        return touched_experts(moe[0], moe[1], tokens), tokens * moe[1]
    return touched_by(shares, tokens)


@lru_cache(maxsize=1 << 14)
def _is_head(layer_key: tuple[str, ...], rel: str) -> bool:
    """Whether a param (its layer's ``name_key`` and its relative name) lies below an LM head."""
    return any(s in _HEADS for s in layer_key) or any(s.lower() in _HEADS for s in rel.split("."))


def _role(layer: str, rel: str, p: PlanParam) -> str:
    kind = p.kind or param_kind(layer, rel)
    if len(p.shape) <= 1 or kind in ("norm", "scale"):  # whatever its name says: no rows to look up or multiply
        return "vector"
    if kind == "embedding" and not _is_head(name_key(layer), rel):
        return "lookup"
    if kind == "routed_experts":
        return "routed"
    return "matmul"


def _numel(p: PlanParam) -> int:
    return math.prod(p.shape)


def _param_ms(role: str, p: PlanParam, tokens: int, hw: HardwareProfile, where: str,
              moe: tuple[int, int] | None, shares: Sequence[float] | None = None) -> tuple[float, float]:
    """Time of one param's kernel and the part of it the host link is busy (0 unless ``where`` is uva);
    ``where``: gpu (resident or a prefetch slot) or uva; ``shares``: measured routing (else uniform)."""
    link = where == "uva"
    if link:
        rate = hw.uva_gbps
    elif role == "routed" and moe is not None:
        rate = hw.experts_gbps
    elif role == "matmul":
        rate = hw.matmul_gbps_at(tokens)  # a decode batch of a few dozen rows reads its weights slower than one
    else:
        rate = hw.gpu_mem_gbps
    if role == "lookup":
        row = p.bytes / max(p.shape[0], 1)
        ms = min(p.bytes, tokens * row) / rate / 1e6
        return ms, ms if link else 0.0
    if role == "vector":
        ms = p.bytes / rate / 1e6
        return ms, ms if link else 0.0
    numel = _numel(p)
    grouped = role == "routed" and moe is not None  # a grouped matmul over the experts the tokens reach
    if grouped:
        experts = moe[0]
        hit, pairs = reach(moe, tokens, shares)
        flops = 2.0 * pairs * numel / experts
        nbytes = p.bytes * hit / experts
        rows = pairs / max(hit, 1e-9)  # tokens each touched expert sees
    else:
        flops, nbytes, rows = 2.0 * tokens * numel, float(p.bytes), float(tokens)
    # a layer's experts read through UVA run the runtime's grouped call over all of them (runtime/experts_forward.py)
    passes = ((uva_passes(shares, moe, tokens, hit, rows, hw, experts) if grouped else hw.passes(rows, p.shape[0]))
              if link else 1.0)
    fixed = (hw.uva_expert_call_ms if role == "routed" else hw.uva_call_ms) if link else 0.0
    read = nbytes * passes / rate / 1e6
    tflops = hw.experts_tflops_at(rows) if grouped else hw.matmul_tflops
    return fixed + max(flops / (tflops * 1e9), read), read if link else 0.0


@dataclass(frozen=True)
class ParamTime:
    """One param's kernel time at some token count, from GPU memory and read through UVA."""

    rel: str
    nbytes: int
    routed: bool
    gpu_ms: float
    uva_ms: float
    uva_link_ms: float  # the host link's part of uva_ms
    late: bool = False  # of a kind that runs after the block's attention (schemas/kinds.py ``AFTER_ATTENTION``)
    uva_call_ms: float = 0.0  # uva_ms's fixed time a call (``uva_expert_call_ms``), which a graph's replay does not pay


def param_time(layer: str, rel: str, p: PlanParam, tokens: int, hw: HardwareProfile,
               moe: tuple[int, int] | None, shares: Sequence[float] | None = None) -> ParamTime:
    role = _role(layer, rel, p)
    uva, link = _param_ms(role, p, tokens, hw, "uva", moe, shares)
    return ParamTime(rel, p.bytes, role == "routed", _param_ms(role, p, tokens, hw, "gpu", moe, shares)[0], uva, link,
                     (p.kind or param_kind(layer, rel)) in AFTER_ATTENTION,
                     hw.uva_expert_call_ms if role == "routed" else 0.0)


def placed_work(times: list[ParamTime], cpu_us: float, expert_us: float, moe_sync: bool, block: float,
                graphable: tuple[str, ...], on_uva, copied, hw: HardwareProfile) -> LayerWork:
    """A layer's work with ``on_uva`` params read through UVA and ``copied`` ones prefetched (sets of names);
    ``block``: the GPU ms of its work besides the params' kernels (planner/cost/block.py); ``graphable``: its
    stacked routed experts where an eager call of them may replay a graph (``layer_times``): it does when the
    placement copies nothing of their module into a prefetch slot (schemas/expert_graphs.py), and the layer then
    issues ``GRAPH_CALL_LAUNCHES`` where the experts call was, and its matmuls through UVA pay no fixed time a call
    (``uva_expert_call_ms``: calibrate measures it in launched calls; in a replay the next kernel starts as the last
    ends, as ``profile_for`` says of graph mode)."""
    graphed = bool(graphable) and module_graphed(graphable, on_uva, copied)  # (what is read through UVA stays put)
    if graphed:
        cpu_us = graphed_issue_us(cpu_us, hw)
    gpu, routed, link, routed_link = block, 0.0, 0.0, 0.0
    copy_bytes = copies = 0
    early, late_uva = block, True  # the work before the late kinds, and whether every UVA param is of one
    for t in times:
        if t.rel in on_uva:
            ms = t.uva_ms - (t.uva_call_ms if graphed and t.rel in graphable else 0.0)
            link += t.uva_link_ms
            routed_link += t.uva_link_ms if t.routed else 0.0
            late_uva = late_uva and t.late
        else:
            ms = t.gpu_ms
        gpu += ms
        early += 0.0 if t.late else ms
        routed += ms if t.routed else 0.0
        if t.rel in copied:
            copy_bytes += t.nbytes
            copies += 1
    copy_ms = copy_bytes / hw.h2d_gbps / 1e6 + copies * hw.copy_call_us / 1e3
    synced = routed if moe_sync else None
    return LayerWork(gpu, (cpu_us + expert_us) / 1e3, copy_ms, copy_bytes, synced,
                     expert_us / 1e3 if synced is not None else 0.0, link,
                     routed_link if synced is not None else 0.0, uva_at_ms=early if link and late_uva else 0.0)


def cpu_us(matrices: int, params: int, moe: tuple[int, int] | None, tokens: int,
           hw: HardwareProfile, shares: Sequence[float] | None = None) -> tuple[float, float]:
    """(issue time of the layer's kernels, of its per-expert loop) in microseconds."""
    if moe is not None:
        base = hw.moe_block_cpu_us
    elif matrices >= 4:
        base = hw.block_cpu_us
    else:
        base = hw.launch_us * (1 + params)
    expert = 0.0 if moe is None else hw.expert_cpu_us * reach(moe, tokens, shares)[0]
    return base, expert


def model_cpu_ms(hw: HardwareProfile) -> float:
    """The CPU time an eager forward spends outside its blocks (``model_cpu_us``): where the CPU's clock starts in
    ``simulate`` (the first layer's kernels are issued after it; 0 in graph replay, ``profile_for``)."""
    return hw.model_cpu_us / 1e3


def block_floor_ms(moe: tuple[int, int] | None, hw: HardwareProfile) -> float:
    """A decoder block's GPU time beyond its roofline: its small kernels' fixed times (``block_gpu_us``, or
    ``moe_block_gpu_us`` for an MoE block), paid in eager runs and in graph replay alike."""
    return (hw.moe_block_gpu_us if moe is not None else hw.block_gpu_us) / 1e3


def layer_times(name: str, params, moe: tuple[int, int] | None, tokens: int, hw: HardwareProfile,
                seqs: Sequences = ONE, shares: Sequence[float] | None = None,
                block_moe: tuple[int, int] | None = None, graphs: bool = True
                ) -> tuple[list[ParamTime], float, float, bool, float, tuple[str, ...]]:
    """Per-param times and (cpu µs, expert µs, synced, block ms, graphable) of a layer whose params are (rel,
    PlanParam) pairs, at ``tokens`` in ``seqs`` (``shares``: its measured routing, else uniform). ``block_moe``: the
    MoE shape of the block these params belong to where they are priced without its experts (a split layer's other
    params, planner/cost/host_experts.py): the block's floor is still an MoE block's. ``graphable``: the stacked
    routed experts params whose eager call replays a graph unless copied (``placed_work``): at most
    ``GRAPHED_MAX_TOKENS`` tokens of an MoE block that reads nothing back (not ``moe_sync``), in a plan applied with
    the layer graphs (``graphs``: the module docstring); else empty."""
    times = [param_time(name, rel, p, tokens, hw, moe, shares) for rel, p in params]
    roles = [(rel, p, _role(name, rel, p)) for rel, p in params]
    matrices = sum(1 for _, _, role in roles if role in ("matmul", "routed"))
    base, expert = cpu_us(matrices, len(times), moe, tokens, hw, shares)
    of_moe = moe if moe is not None else block_moe
    block = block_ms(block_shape(roles, moe), tokens, seqs, hw) + block_floor_ms(of_moe, hw) \
        if of_moe is not None or matrices >= 4 else 0.0
    graphable = stacked_experts(name, params) if (
        graphs and moe is not None and not hw.moe_sync and tokens <= GRAPHED_MAX_TOKENS) else ()
    return times, base, expert, moe is not None and hw.moe_sync, block, graphable


def layer_work(layer: PlanLayer, tokens: int, hw: HardwareProfile, seqs: Sequences = ONE,
               shares: Sequence[float] | None = None, block_moe: tuple[int, int] | None = None,
               graphs: bool = True) -> LayerWork:
    """The layer's GPU, CPU and copy time at ``tokens``: its ``uva`` params read over the link, its other
    offloaded params copied; ``shares``: its experts' measured routing (else uniform); ``block_moe`` and
    ``graphs``: as ``layer_times`` says."""
    on_uva = set(layer.uva)
    copied = set(layer.offloaded) - on_uva
    moe = moe_shape(layer.moe)
    return placed_work(*layer_times(layer.name, list(layer.params.items()), moe, tokens, hw, seqs,
                                    shares if moe is not None else None, block_moe, graphs), on_uva, copied, hw)


def _description(layer: PlanLayer) -> tuple:
    """All that ``layer_work`` reads of a layer: equal descriptions cost the same."""
    params = tuple((rel, tuple(p.shape), p.dtype, p.bytes, p.kind) for rel, p in layer.params.items())
    moe = moe_shape(layer.moe)
    return name_key(layer.name), params, moe, tuple(layer.uva), tuple(layer.offloaded)


def layers_work(layers: list[PlanLayer], tokens: int, hw: HardwareProfile, seqs: Sequences = ONE,
                routing: Mapping[str, Sequence[float]] | None = None, graphs: bool = True) -> list[LayerWork]:
    """``layer_work`` of each layer, computed once per distinct description (a stack of a thousand
    equal blocks is costed once); ``routing``: layer name -> its experts' measured chances of being picked;
    ``graphs``: as ``layer_times`` says."""
    seen: dict[tuple, LayerWork] = {}
    described: dict[tuple, tuple] = {}  # the same param objects, name key and placement: the same description
    out = []
    for layer in layers:
        shares = routing.get(layer.name) if routing and layer.moe is not None else None
        same = (name_key(layer.name), tuple(layer.params), tuple(map(id, layer.params.values())),
                None if layer.moe is None else id(layer.moe), tuple(layer.uva), tuple(layer.offloaded))
        description = described.get(same)
        if description is None:
            description = described[same] = _description(layer)
        key = description if shares is None else (description, tuple(shares))
        work = seen.get(key)
        if work is None:
            work = seen[key] = layer_work(layer, tokens, hw, seqs, shares, graphs=graphs)
        out.append(work)
    return out


def gpu_and_uva_ms(layer: str, t: Tensor, tokens: int, hw: HardwareProfile,
                   moe: tuple[int, int] | None) -> tuple[float, float]:
    """A spec tensor's kernel time at ``tokens`` from GPU memory and read through UVA."""
    p = PlanParam.model_construct(shape=list(t.shape), dtype=t.dtype, bytes=t.nbytes, kind=t.kind)
    role = _role(layer, t.name, p)
    return _param_ms(role, p, tokens, hw, "gpu", moe)[0], _param_ms(role, p, tokens, hw, "uva", moe)[0]
