"""A decoder layer as vLLM sees it: its params under vLLM's names, in vLLM's order.

vLLM's offloaders walk ``module.named_parameters()`` of each decoder layer, and vLLM's model
classes fuse what transformers and the checkpoints keep apart (read in vLLM's
vllm/model_executor/models/llama.py, mixtral.py, deepseek_v2.py and the FusedMoE layer):

- ``P.q_proj``, ``P.k_proj``, ``P.v_proj`` -> one ``P.qkv_proj`` (weight and bias each), when all three exist
  (MLA's ``q_proj`` alone, as in DeepSeek-V2-Lite, stays ``q_proj``);
- ``P.gate_proj`` + ``P.up_proj`` -> ``P.gate_up_proj`` (Llama's MLP, DeepSeek's dense and shared-expert MLPs);
- routed experts -> two stacked params of the FusedMoE layer: ``P.experts.w13_weight`` (every expert's
  ``w1``/``gate_proj`` and ``w3``/``up_proj``; transformers 5's ``experts.gate_up_proj``) and
  ``P.experts.w2_weight`` (``w2``/``down_proj``; transformers 5's ``experts.down_proj``).

Order: a fused param takes the place of its first member; inside an MoE block (the parent of
``experts``) vLLM registers the router (``gate``) first, then the shared experts, then the routed
experts (DeepseekV2MoE and MixtralMoE build them in that order), which may differ from a spec
made from transformers. Buffers are not parameters (``named_parameters`` skips them). Module
names are otherwise the spec's: a model class that names a module differently from the spec
(vLLM's Mixtral calls transformers 5's ``mlp`` ``block_sparse_moe``) is matched by the spec's
name. A param fused in vLLM moves whole: offloading ``q_proj`` without ``k_proj`` is no vLLM plan.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_EXPERT = re.compile(r"(?P<p>(?:.+\.)?experts)\.[0-9]+\.(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)\.weight")
_STACKED = re.compile(r"(?P<p>(?:.+\.)?experts)\.(?P<proj>gate_up_proj|down_proj)")
_QKV = re.compile(r"(?P<p>(?:.+\.)?)(?P<proj>q_proj|k_proj|v_proj)\.(?P<t>weight|bias)")
_GATE_UP = re.compile(r"(?P<p>(?:.+\.)?)(?P<proj>gate_proj|up_proj)\.(?P<t>weight|bias)")
_W13 = {"w1", "w3", "gate_proj", "up_proj", "gate_up_proj"}


@dataclass(frozen=True)
class VllmParam:
    """One of vLLM's params of a layer: its name (relative to the layer), the spec params it holds, bytes."""

    name: str
    members: tuple[str, ...]
    nbytes: int


@dataclass(frozen=True)
class SpecParam:
    """What the layout needs of a spec (or plan) param."""

    name: str
    nbytes: int
    buffer: bool = False


def vllm_params(params: Iterable[SpecParam]) -> list[VllmParam]:
    """The layer's params as vLLM's ``named_parameters()`` lists them (buffers left out)."""
    own = [p for p in params if not p.buffer]
    fused: dict[str, str] = {}  # spec name -> vLLM name
    for p in own:
        m = _EXPERT.fullmatch(p.name) or _STACKED.fullmatch(p.name)
        if m:
            fused[p.name] = f"{m['p']}.{'w13_weight' if m['proj'] in _W13 else 'w2_weight'}"
    names = {p.name for p in own}
    for p in own:
        if p.name in fused:
            continue
        m = _QKV.fullmatch(p.name)
        if m and all(f"{m['p']}{x}.{m['t']}" in names for x in ("q_proj", "k_proj", "v_proj")):
            fused[p.name] = f"{m['p']}qkv_proj.{m['t']}"
            continue
        m = _GATE_UP.fullmatch(p.name)
        if m and all(f"{m['p']}{x}.{m['t']}" in names for x in ("gate_proj", "up_proj")):
            fused[p.name] = f"{m['p']}gate_up_proj.{m['t']}"
    order: list[str] = []
    members: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for p in own:
        name = fused.get(p.name, p.name)
        if name not in members:
            order.append(name)
            members[name] = []
            sizes[name] = 0
        members[name].append(p.name)
        sizes[name] += p.nbytes
    return [VllmParam(n, tuple(members[n]), sizes[n]) for n in _moe_order(order)]


def _moe_order(names: list[str]) -> list[str]:
    """Inside each MoE block (the parent of a fused ``experts``): router, shared experts, routed experts."""
    out = list(names)
    prefixes = {m.group(1) for n in names if (m := re.fullmatch(r"(.+\.)experts\.w(?:13|2)_weight", n))}
    for prefix in sorted(prefixes):
        at = [i for i, n in enumerate(out) if n.startswith(prefix)]
        inside = sorted((out[i] for i in at), key=lambda n: _rank(n[len(prefix):]))  # stable
        for i, n in zip(at, inside):
            out[i] = n
    return out


def _rank(rel: str) -> int:
    head = rel.split(".", 1)[0]
    if head == "gate":
        return 0
    if head in ("shared_expert", "shared_experts"):
        return 1
    if head == "experts":
        return 2
    return 3


def matches(name: str, segments: Iterable[str]) -> bool:
    """vLLM's param filter: some segment occurs in ``name`` as a run of whole dotted segments."""
    from planner.layers import matches_segments

    return any(matches_segments(name, s) for s in segments)
