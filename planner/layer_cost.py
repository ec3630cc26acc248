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

CPU time (eager PyTorch): ``moe_block_cpu_us`` for an MoE block, ``block_cpu_us`` for
another decoder block (a layer with 4 or more matrices), ``launch_us`` per param for a small
layer, plus ``expert_cpu_us`` per touched expert (MoE blocks that loop over experts). With ``moe_sync`` (transformers' eager MoE blocks) the CPU waits for the GPU before
the expert loop, so the experts' kernels start only after everything before them has run.
Attention's own arithmetic (softmax over the context) is not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.kinds import param_kind
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


def touched_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts hit by ``tokens`` tokens routed uniformly to ``top_k`` of ``experts``."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def _role(layer: str, rel: str, p: PlanParam) -> str:
    kind = p.kind or param_kind(layer, rel)
    if kind == "embedding" and not any(s in _HEADS for s in f"{layer}.{rel}".split(".")):
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


def layer_work(layer: PlanLayer, tokens: int, hw: HardwareProfile) -> LayerWork:
    """The layer's GPU, CPU and copy time at ``tokens``: its ``uva`` params read over the link, its other
    offloaded params copied."""
    off = set(layer.offloaded)
    on_uva = set(layer.uva)
    copied = off - on_uva
    moe = (layer.moe.experts, layer.moe.top_k) if layer.moe is not None else None
    gpu = routed = 0.0
    matrices = 0
    copy_bytes = 0
    for rel, p in layer.params.items():
        role = _role(layer.name, rel, p)
        matrices += role in ("matmul", "routed")
        where = "uva" if rel in on_uva else "gpu"
        ms = _param_ms(role, p, tokens, hw, where, moe)
        gpu += ms
        routed += ms if role == "routed" else 0.0
        if rel in copied:
            copy_bytes += p.bytes
    if moe is not None:
        cpu_us = hw.moe_block_cpu_us
    elif matrices >= 4:
        cpu_us = hw.block_cpu_us
    else:
        cpu_us = hw.launch_us * (1 + len(layer.params))
    expert_us = 0.0 if moe is None else hw.expert_cpu_us * touched_experts(moe[0], moe[1], tokens)
    copies = len(copied)
    copy_ms = copy_bytes / hw.h2d_gbps / 1e6 + copies * hw.copy_call_us / 1e3
    synced = routed if (moe is not None and hw.moe_sync) else None
    return LayerWork(gpu, (cpu_us + expert_us) / 1e3, copy_ms, copy_bytes, synced,
                     expert_us / 1e3 if synced is not None else 0.0)


def gpu_and_uva_ms(layer: str, t: Tensor, tokens: int, hw: HardwareProfile,
                   moe: tuple[int, int] | None) -> tuple[float, float]:
    """A spec tensor's kernel time at ``tokens`` from GPU memory and read through UVA."""
    p = PlanParam.model_construct(shape=list(t.shape), dtype=t.dtype, bytes=t.nbytes, kind=t.kind)
    role = _role(layer, t.name, p)
    return _param_ms(role, p, tokens, hw, "gpu", moe), _param_ms(role, p, tokens, hw, "uva", moe)
