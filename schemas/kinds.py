"""What a param is, from its dotted name: attention, dense MLP, shared or routed experts, router, norm, scale...

Pure functions of names (no torch, no shapes). A param is classified by its full
name (layer name + ``.`` + name relative to the layer), so a spec cut into finer
layers (``model.layers.3.mlp`` holding ``experts.0.w1.weight``) classifies the
same as one with whole decoder blocks. The rules, first match wins (docs/DESIGN.md,
"Kinds", says why this order):

1. ``norm``: a segment holding ``norm`` (``input_layernorm``, ``q_a_layernorm``,
   ``LayerNorm``, ``model.norm``) or named like ``ln_1``/``ln_f``/``ln2``.
2. ``scale``: quantization metadata, by the tensor's own name: ``*_scale``,
   ``*_scale_inv``, ``*_scales``, ``*_scale_2``, ``scale(s)``, ``zeros``, ``qzeros``,
   ``*_zero_point``, ``*g_idx``, ``absmax``, ``quant_map``, ``SCB``, or anything
   below a ``quant_state*`` segment (bitsandbytes).
3. ``shared_experts``: below ``shared_expert``, ``shared_experts`` or ``shared_mlp``.
4. ``routed_experts``: below ``experts`` (or ``*_experts``: ``local_experts``),
   numbered (``experts.3.w1``) or fused (``experts.gate_up_proj``, 3-D).
5. ``router``: below ``gate``, ``gating``, ``*router*``, ``*_gate``
   (``shared_expert_gate``) or ``moe_statics``, or a ``*correction_bias``
   (DeepSeek-V3's ``e_score_correction_bias``).
6. ``routed_experts`` again: anything else below a ``*moe*`` container
   (GraniteMoE's fused ``block_sparse_moe.input_linear``).
7. ``attention``: below a segment holding ``attn`` or ``attention``, or a bare
   attention projection (``q_proj``, ``kv_a_proj_with_mqa``, ``query_key_value``, ``wq``...).
8. ``dense_mlp``: below ``mlp``, ``feed_forward``, ``ffn``... or a bare MLP
   projection (``gate_proj``, ``up_proj``, ``down_proj``, ``w1``/``w2``/``w3``, ``fc1``...).
9. ``embedding``: token/position embeddings and the LM head (``embed_tokens``,
   ``wte``, ``lm_head``, ``embed_out``...).
10. ``other``: everything else (a layer's bare ``weight``, Mamba mixers, rotary buffers
    outside attention).

A param's explicit ``kind:`` in the spec overrides all of this.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

from schemas.spec_layers import PARAM_KINDS, ParamKind

__all__ = ["AFTER_ATTENTION", "PARAM_KINDS", "ParamKind", "classify", "expert_count_problems", "is_experts_container",
           "name_key", "param_kind"]

# the kinds a decoder block runs after its attention (and its routing): the cost model starts a layer's UVA reads
# after the rest of its work where every param it reads through UVA is of one (planner/cost/layer.py)
AFTER_ATTENTION: frozenset[str] = frozenset({"dense_mlp", "shared_experts", "routed_experts"})

_LN = re.compile(r"^ln(_\w+|\d+)?$")
_SCALE = re.compile(
    r"^(?:.*_)?(?:scale|scales|scale_inv|scale_2|zeros|qzeros|zero_point|g_idx|absmax|nested_absmax"
    r"|quant_map|nested_quant_map|scb)$")
_SHARED = {"shared_expert", "shared_experts", "shared_mlp"}
_ROUTER = {"gate", "gating", "moe_statics"}
_ATTENTION_PROJ = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "query_key_value", "q_a_proj", "q_b_proj",
                   "kv_a_proj_with_mqa", "kv_b_proj", "wq", "wk", "wv", "wo", "wqkv", "query", "key", "value"}
_MLP = {"mlp", "feed_forward", "ffn", "ff", "fc1", "fc2", "c_fc", "gate_proj", "up_proj", "down_proj",
        "gate_up_proj", "dense_h_to_4h", "dense_4h_to_h", "w1", "w2", "w3", "intermediate"}
_EMBEDDING = {"wte", "wpe", "lm_head", "embed_out", "embed_in"}


def _is_norm(seg: str) -> bool:
    return "norm" in seg or bool(_LN.match(seg))


def _is_router(seg: str) -> bool:
    return seg in _ROUTER or "router" in seg or seg.endswith("_gate")


def _is_embedding(seg: str) -> bool:
    return seg in _EMBEDDING or seg.startswith("embed") or seg.endswith("embeddings") or seg.endswith("_embedding")


@lru_cache(maxsize=4096)
def is_experts_container(segment: str) -> bool:
    """A module that holds routed experts: ``experts``, ``*_experts`` (``local_experts``), or any ``*moe*``
    module (lower-case segments)."""
    return segment == "experts" or segment.endswith("_experts") or "moe" in segment


@lru_cache(maxsize=1 << 14)
def _classify(segments: tuple[str, ...]) -> ParamKind:
    """The kind of the param with these segments; memoized: layers of one stack share their segments
    (numbers read as ``#``), so a spec of a thousand blocks classifies each distinct name once."""
    last = segments[-1]
    if any(_is_norm(s) for s in segments):
        return "norm"
    if _SCALE.match(last) or any(s.startswith("quant_state") for s in segments):
        return "scale"
    if any(s in _SHARED for s in segments):
        return "shared_experts"
    if any(s == "experts" or s.endswith("_experts") for s in segments):
        return "routed_experts"
    if any(_is_router(s) for s in segments) or last.endswith("correction_bias"):
        return "router"
    if any("moe" in s for s in segments[:-1]):
        return "routed_experts"
    if any("attn" in s or "attention" in s or s in _ATTENTION_PROJ for s in segments):
        return "attention"
    if any(s in _MLP for s in segments):
        return "dense_mlp"
    if any(_is_embedding(s) for s in segments):
        return "embedding"
    return "other"


def _segments(name: str) -> tuple[str, ...]:
    return tuple("#" if s.isdigit() else s.lower() for s in name.split("."))


_relative_segments = lru_cache(maxsize=4096)(_segments)  # a param's name within its layer repeats across layers
_layer_segments = lru_cache(maxsize=1 << 17)(_segments)  # a layer's params are classified together, often twice


def name_key(layer: str) -> tuple[str, ...]:
    """A layer's name as the kind rules read it: lower case, every number the same (``model.layers.#``),
    so layers of one stack share it (and what is cached by it)."""
    return _layer_segments(layer)


def classify(name: str) -> ParamKind:
    """The kind of the param with this full dotted name (case-insensitive; numbers never matter)."""
    return _classify(_segments(name))


def param_kind(layer: str, name: str, explicit: str | None = None) -> ParamKind:
    """The kind of param ``name`` (relative to ``layer``): the spec's explicit ``kind``, else ``classify``."""
    if explicit is not None:
        return explicit  # type: ignore[return-value]  # validated against PARAM_KINDS by the spec
    return _classify(_layer_segments(layer) + _relative_segments(name))  # = classify(f"{layer}.{name}")


def expert_count_problems(layer: str, experts: int, tensors: Iterable[tuple[str, Sequence[int], str | None]]
                          ) -> list[str]:
    """Routed-expert tensors that hold the experts in one tensor (3-D and more, expert first, as transformers 5
    stores them) must hold as many as the layer's ``moe`` says, the count the cost model prices them by, or an equal
    share of them (a rank's local shard under tensor parallelism: ``describe(local=True)``). ``tensors``: (name
    relative to ``layer``, shape, explicit kind) of a spec's or a plan's layer."""
    out = []
    for name, shape, kind in tensors:
        if len(shape) < 3 or param_kind(layer, name, kind) != "routed_experts":
            continue
        held = shape[0]
        if held != experts and not (0 < held < experts and experts % held == 0):
            out.append(f"{layer}.{name} holds {held} experts (shape {list(shape)}), but moe.experts is "
                       f"{experts} (expected {experts}, or an equal share of them)")
    return out
