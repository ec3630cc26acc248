"""What one layer costs at T tokens: GPU time, CPU issue time and prefetch copy time.

A roofline per param, from the plan alone (shapes, dtypes, kinds, which params are offloaded
and how: a param in the layer's ``uva`` list is read over the host link, another offloaded param
is copied into a slot by the prefetch stream) and a hardware profile:

- a matrix (2-D or more) is a matmul: ``max(2·T·numel / matmul rate, bytes / memory rate)``;
  through UVA the bytes come over the host link instead, read ``passes(T)`` times;
- an embedding table is a lookup: T rows are read;
- a vector (norm weight, bias) or a quantization scale is read once;
- routed experts: a layer with ``moe`` (E experts, top-k) touches on average
  ``E·(1 - (1 - k/E)^T)`` experts at T tokens (uniform routing), so that share of the bytes
  is read, and ``2·T·k·numel/E`` flops are done; a prefetch copy still moves every expert.
  Read through UVA, a grouped expert matmul also pays a fixed ``uva_expert_call_ms``.

In CUDA graph replay (a workload's ``mode: graph``) the CPU issues nothing per kernel and nothing is
read back mid-layer: ``profile_for`` gives the profile with those CPU costs at zero.

CPU time (eager PyTorch): ``moe_block_cpu_us`` for an MoE block, ``block_cpu_us`` for
another decoder block (a layer with 4 or more matrices), ``launch_us`` per param for a small
layer, plus ``expert_cpu_us`` per touched expert (MoE blocks that loop over experts). With ``moe_sync`` (transformers' eager MoE blocks) the CPU waits for the GPU before
the expert loop, so the experts' kernels start only after everything before them has run.
Attention's own arithmetic (softmax over the context) is not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from functools import lru_cache

from planner.kinds import name_key, param_kind
from schemas.hardware import HardwareProfile
from schemas.plan import PlanLayer, PlanParam
from schemas.spec import Tensor

_HEADS = {"lm_head", "embed_out"}


@dataclass(frozen=True)
class LayerWork:
    gpu_ms: float  # compute stream: kernels, UVA reads included
    cpu_ms: float  # CPU time to issue the layer's kernels
    copy_ms: float  # copy stream: its prefetched params (0 when nothing is prefetched)
    copy_bytes: int
    # the part of gpu_ms / cpu_ms issued after the CPU waits for the GPU mid-layer (an eager MoE
    # block reads the routing back to loop over the experts it hit); None: no such wait
    synced_gpu_ms: float | None = None
    synced_cpu_ms: float = 0.0


def profile_for(hw: HardwareProfile, mode: str) -> HardwareProfile:
    """``hw`` as a forward run in ``mode`` sees it: in CUDA graph replay no CPU issue time and no mid-layer
    read-back (a captured forward cannot wait on the CPU); eager: ``hw`` itself."""
    if mode == "eager":
        return hw
    return hw.model_copy(update={"launch_us": 0.0, "block_cpu_us": 0.0, "moe_block_cpu_us": 0.0,
                                 "expert_cpu_us": 0.0, "moe_sync": False})


def touched_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts hit by ``tokens`` tokens routed uniformly to ``top_k`` of ``experts``."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


@lru_cache(maxsize=1 << 14)
def _is_head(layer_key: tuple[str, ...], rel: str) -> bool:
    """Whether a param (its layer's ``name_key`` and its relative name) lies below an LM head."""
    return any(s in _HEADS for s in layer_key) or any(s.lower() in _HEADS for s in rel.split("."))


def _role(layer: str, rel: str, p: PlanParam) -> str:
    kind = p.kind or param_kind(layer, rel)
    if kind == "embedding" and not _is_head(name_key(layer), rel):
        return "lookup"
    if kind == "routed_experts" and len(p.shape) >= 2:
        return "routed"
    if len(p.shape) <= 1 or kind in ("norm", "scale"):
        return "vector"
    return "matmul"


def _numel(p: PlanParam) -> int:
    return math.prod(p.shape)


def _param_ms(role: str, p: PlanParam, tokens: int, hw: HardwareProfile, where: str,
              moe: tuple[int, int] | None) -> float:
    """Time of one param's kernel; ``where``: gpu (resident or a prefetch slot) or uva."""
    rate = hw.uva_gbps if where == "uva" else hw.gpu_mem_gbps
    if role == "lookup":
        row = p.bytes / max(p.shape[0], 1)
        return min(p.bytes, tokens * row) / rate / 1e6
    if role == "vector":
        return p.bytes / rate / 1e6
    numel = _numel(p)
    if role == "routed" and moe is not None:
        experts, top_k = moe
        hit = touched_experts(experts, top_k, tokens)
        flops = 2.0 * tokens * top_k * numel / experts
        nbytes = p.bytes * hit / experts
        rows = tokens * top_k / max(hit, 1e-9)  # tokens each touched expert sees
    else:
        flops, nbytes, rows = 2.0 * tokens * numel, float(p.bytes), float(tokens)
    passes = hw.passes(rows) if where == "uva" else 1.0
    fixed = hw.uva_expert_call_ms if (where == "uva" and role == "routed") else 0.0
    return fixed + max(flops / (hw.matmul_tflops * 1e9), nbytes * passes / rate / 1e6)


@dataclass(frozen=True)
class ParamTime:
    """One param's kernel time at some token count, from GPU memory and read through UVA."""

    rel: str
    nbytes: int
    routed: bool
    gpu_ms: float
    uva_ms: float


def param_time(layer: str, rel: str, p: PlanParam, tokens: int, hw: HardwareProfile,
               moe: tuple[int, int] | None) -> ParamTime:
    role = _role(layer, rel, p)
    return ParamTime(rel, p.bytes, role == "routed", _param_ms(role, p, tokens, hw, "gpu", moe),
                     _param_ms(role, p, tokens, hw, "uva", moe))


def placed_work(times: list[ParamTime], cpu_us: float, expert_us: float, moe_sync: bool, on_uva, copied,
                hw: HardwareProfile) -> LayerWork:
    """A layer's work with ``on_uva`` params read through UVA and ``copied`` ones prefetched (sets of names)."""
    gpu = routed = 0.0
    copy_bytes = copies = 0
    for t in times:
        ms = t.uva_ms if t.rel in on_uva else t.gpu_ms
        gpu += ms
        routed += ms if t.routed else 0.0
        if t.rel in copied:
            copy_bytes += t.nbytes
            copies += 1
    copy_ms = copy_bytes / hw.h2d_gbps / 1e6 + copies * hw.copy_call_us / 1e3
    synced = routed if moe_sync else None
    return LayerWork(gpu, (cpu_us + expert_us) / 1e3, copy_ms, copy_bytes, synced,
                     expert_us / 1e3 if synced is not None else 0.0)


def cpu_us(matrices: int, params: int, moe: tuple[int, int] | None, tokens: int,
           hw: HardwareProfile) -> tuple[float, float]:
    """(issue time of the layer's kernels, of its per-expert loop) in microseconds."""
    if moe is not None:
        base = hw.moe_block_cpu_us
    elif matrices >= 4:
        base = hw.block_cpu_us
    else:
        base = hw.launch_us * (1 + params)
    expert = 0.0 if moe is None else hw.expert_cpu_us * touched_experts(moe[0], moe[1], tokens)
    return base, expert


def layer_times(name: str, params, moe: tuple[int, int] | None, tokens: int,
                hw: HardwareProfile) -> tuple[list[ParamTime], float, float, bool]:
    """Per-param times and (cpu µs, expert µs, synced) of a layer whose params are (rel, PlanParam) pairs."""
    times = [param_time(name, rel, p, tokens, hw, moe) for rel, p in params]
    matrices = sum(1 for (rel, p) in params if _role(name, rel, p) in ("matmul", "routed"))
    base, expert = cpu_us(matrices, len(times), moe, tokens, hw)
    return times, base, expert, moe is not None and hw.moe_sync


def layer_work(layer: PlanLayer, tokens: int, hw: HardwareProfile) -> LayerWork:
    """The layer's GPU, CPU and copy time at ``tokens``: its ``uva`` params read over the link, its other
    offloaded params copied."""
    on_uva = set(layer.uva)
    copied = set(layer.offloaded) - on_uva
    moe = (layer.moe.experts, layer.moe.top_k) if layer.moe is not None else None
    times, base, expert, sync = layer_times(layer.name, list(layer.params.items()), moe, tokens, hw)
    return placed_work(times, base, expert, sync, on_uva, copied, hw)


def _description(layer: PlanLayer) -> tuple:
    """All that ``layer_work`` reads of a layer: equal descriptions cost the same."""
    params = tuple((rel, tuple(p.shape), p.dtype, p.bytes, p.kind) for rel, p in layer.params.items())
    moe = (layer.moe.experts, layer.moe.top_k) if layer.moe is not None else None
    return name_key(layer.name), params, moe, tuple(layer.uva), tuple(layer.offloaded)


def layers_work(layers: list[PlanLayer], tokens: int, hw: HardwareProfile) -> list[LayerWork]:
    """``layer_work`` of each layer, computed once per distinct description (a stack of a thousand
    equal blocks is costed once)."""
    seen: dict[tuple, LayerWork] = {}
    out = []
    for layer in layers:
        key = _description(layer)
        work = seen.get(key)
        if work is None:
            work = seen[key] = layer_work(layer, tokens, hw)
        out.append(work)
    return out


def gpu_and_uva_ms(layer: str, t: Tensor, tokens: int, hw: HardwareProfile,
                   moe: tuple[int, int] | None) -> tuple[float, float]:
    """A spec tensor's kernel time at ``tokens`` from GPU memory and read through UVA."""
    p = PlanParam.model_construct(shape=list(t.shape), dtype=t.dtype, bytes=t.nbytes, kind=t.kind)
    role = _role(layer, t.name, p)
    return _param_ms(role, p, tokens, hw, "gpu", moe), _param_ms(role, p, tokens, hw, "uva", moe)


def attention_positions(layers) -> list[int]:
    """The positions of the layers holding attention matrices, which read the KV cache (spec layers or plan
    layers: anything with a name and params, each with a shape and a kind)."""
    out = []
    for i, layer in enumerate(layers):
        params = layer.params.items() if isinstance(layer.params, dict) else ((t.name, t) for t in layer.params)
        if any(len(p.shape) >= 2 and param_kind(layer.name, rel, p.kind) == "attention" for rel, p in params):
            out.append(i)
    return out


def read_kv(work: list[LayerWork], attention: list[int], nbytes: int, hw: HardwareProfile) -> None:
    """Add reading ``nbytes`` of KV cache from GPU memory to the attention layers' GPU time, split evenly (an
    SDPA decode step is bound by that read)."""
    extra = nbytes / max(len(attention), 1) / hw.gpu_mem_gbps / 1e6
    for i in attention:
        work[i] = replace(work[i], gpu_ms=work[i].gpu_ms + extra)
