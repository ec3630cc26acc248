"""What a layer computes, read from its params' names and shapes: its attention's query, key and value
widths, its MLP's inner width, its routed experts, an embedding lookup's or an LM head's width.

A projection's output width is its weight's first dimension (``nn.Linear`` stores ``[out, in]``; GPT-2's
``Conv1D`` modules ``c_attn``, ``c_fc`` and ``c_proj`` store ``[in, out]``). Names are read as
``schemas.kinds`` reads them (the module holding the weight): ``q_proj``/``wq``/``query`` and
``q_b_proj`` (queries), ``k_proj``/``wk``/``key``, ``v_proj``/``wv``/``value``, fused ``qkv_proj``/
``query_key_value``/``wqkv``/``c_attn``, DeepSeek's latent attention ``kv_a_proj_with_mqa`` with
``kv_b_proj``; MLPs ``gate_proj`` with ``up_proj`` (or ``w1`` with ``w3``), fused ``gate_up_proj``, a plain
``up_proj``/``fc1``/``c_fc``/``dense_h_to_4h``; routed experts (kind ``routed_experts``) as 3-D tensors
``[experts, out, in]`` or one module per expert; shared experts (kind ``shared_experts``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from schemas.kinds import name_key, param_kind
from schemas.spec_layers import Layer, MoeSpec, Tensor, moe_shape

_Q = {"q_proj", "wq", "query", "q_b_proj"}
_K = {"k_proj", "wk", "key"}
_V = {"v_proj", "wv", "value"}
_QKV = {"qkv_proj", "query_key_value", "wqkv", "c_attn"}
_MLA_A, _MLA_B = "kv_a_proj_with_mqa", "kv_b_proj"
_GATE = {"gate_proj", "w1"}
_UP = {"up_proj", "w3"}
_FUSED_MLP = {"gate_up_proj", "w13"}
_PLAIN_UP = {"fc1", "c_fc", "dense_h_to_4h", "fc_in"}
_CONV1D = {"c_attn", "c_fc", "c_proj"}
_HEADS = {"lm_head", "embed_out"}  # and a layer named just ``output`` (Meta's checkpoints)

MlpKind = Literal["gated", "fused", "plain"]


@dataclass(frozen=True)
class Attention:
    q: int  # query width per token
    k: int | None  # key width per token (None: a fused projection without model.attention cannot be split)
    v: int | None
    outputs: int  # what the projections output per token together
    fused: bool  # q, k and v are views of one output, alive while any of them is
    latent: tuple[int, int] | None = None  # DeepSeek's latent attention: (kv_a width, kv_b width)


@dataclass(frozen=True)
class Mlp:
    kind: MlpKind
    inner: int  # the intermediate width


@dataclass(frozen=True)
class Experts:
    experts: int
    top_k: int
    inner: int  # one expert's intermediate width
    hidden: int  # its input width
    stacked: bool = True  # held as 3-D tensors, expert first (transformers 5), not one module per expert


@dataclass(frozen=True)
class LayerShape:
    name: str
    attention: Attention | None = None
    mlp: Mlp | None = None
    experts: Experts | None = None
    shared: Mlp | None = None  # shared experts: a dense MLP beside the routed ones
    lookup: int | None = None  # an input embedding: its width
    head: int | None = None  # an LM head: the logits' width (the vocabulary)
    attention_params: tuple[str, ...] = ()  # its matrices of kind attention (recognized or not)
    hidden: int | None = None  # the width its first projection reads (a block's input)

    @property
    def block(self) -> bool:
        return self.attention is not None or self.mlp is not None or self.experts is not None


def module_of(rel: str) -> str:
    """The module a param's relative name belongs to, lower case (``self_attn.q_proj.weight`` -> ``q_proj``);
    a fused expert tensor is its own module (``experts.gate_up_proj``)."""
    parts = rel.lower().split(".")
    if len(parts) > 1 and parts[-1] in ("weight", "bias", "qweight"):
        return parts[-2]
    return parts[-1]


def out_width(t: Tensor) -> int:
    if module_of(t.name) in _CONV1D:
        return t.shape[-1]
    return t.shape[-2] if len(t.shape) == 3 else t.shape[0]


def in_width(t: Tensor) -> int:
    return t.shape[0] if module_of(t.name) in _CONV1D else t.shape[-1]


def layer_shapes(layers: Sequence[Layer], heads: int | None, kv_heads: int | None) -> list[LayerShape]:
    """What each layer computes (``heads``/``kv_heads``: the spec's ``model.attention``, to split a fused
    projection and size a latent attention's cache); tied params read as their owners."""
    owners = {f"{layer.name}.{t.name}": t for layer in layers for t in layer.params} if any(
        layer.tied for layer in layers) else {}
    out = []
    made: dict[tuple, LayerShape] = {}  # one shape per distinct description: a stack of equal blocks is read once
    listed: dict[tuple, LayerShape] = {}  # and per layer listing the same params objects, untied, found at once
    for layer in layers:
        moe = moe_shape(layer.moe)
        # all that ``_shape`` reads of the name: its kind rules' key and whether it names a head
        named = (name_key(layer.name), _in_head(layer.name))
        same = None if layer.tied else (named, id(layer.params), moe)
        shape = listed.get(same) if same is not None else None
        if shape is None:
            tensors = list(layer.params) + [_renamed(owners[target], rel) for rel, target in layer.tied.items()
                                            if target in owners]
            key = (*named, tuple(tensors), moe)
            shape = made.get(key)
            if shape is None:
                shape = made[key] = _shape(layer.name, tensors, layer.moe, heads, kv_heads)
            if same is not None:
                listed[same] = shape
        out.append(shape if shape.name == layer.name else _named(shape, layer.name))
    return out


def _named(shape: LayerShape, name: str) -> LayerShape:
    """``dataclasses.replace(shape, name=name)``, made directly (a stack of a thousand blocks renames a thousand)."""
    return LayerShape(name, shape.attention, shape.mlp, shape.experts, shape.shared, shape.lookup, shape.head,
                      shape.attention_params, shape.hidden)


def _in_head(name: str) -> bool:
    return name.lower() == "output" or any(s in _HEADS for s in name.lower().split("."))


def _renamed(t: Tensor, rel: str) -> Tensor:
    return Tensor(rel, t.shape, t.dtype, t.stride, t.buffer, t.nbytes, t.kind)


def _shape(name: str, tensors: Iterable[Tensor], moe: MoeSpec | None, heads: int | None,
           kv_heads: int | None) -> LayerShape:
    by_module: dict[str, Tensor] = {}
    routed: list[Tensor] = []
    shared: dict[str, Tensor] = {}
    attention: list[str] = []
    lookup = head = hidden = None
    in_head = _in_head(name)
    for t in tensors:
        if len(t.shape) < 2:
            continue
        kind = param_kind(name, t.name, t.kind)
        module = module_of(t.name)
        if kind == "routed_experts":
            routed.append(t)
        elif kind == "shared_experts":
            shared.setdefault(module, t)
        elif in_head or module in _HEADS:
            head = t.shape[0]
        elif kind == "embedding":
            lookup = t.shape[-1]
        else:
            by_module.setdefault(module, t)
            hidden = hidden or in_width(t)
            if kind == "attention":
                attention.append(t.name)
    return LayerShape(name, _attention(by_module, heads, kv_heads), _mlp(by_module), _experts(routed, moe),
                      _mlp(shared), lookup, head, tuple(attention), hidden)


def _attention(m: dict[str, Tensor], heads: int | None, kv_heads: int | None) -> Attention | None:
    q = next((m[n] for n in _Q if n in m), None)
    if _MLA_A in m and _MLA_B in m and q is not None:
        return _latent(out_width(q), m[_MLA_A], m[_MLA_B], heads)
    fused = next((m[n] for n in _QKV if n in m), None)
    if fused is not None:
        width = out_width(fused)
        if heads is None:
            return Attention(width // 3, None, None, width, True)
        kv = kv_heads or heads
        k = width * kv // (heads + 2 * kv)  # by the heads' ratio, which a tensor-parallel split keeps
        return Attention(width - 2 * k, k, k, width, True)
    k = next((m[n] for n in _K if n in m), None)
    v = next((m[n] for n in _V if n in m), None)
    if q is None or k is None or v is None:
        return None
    widths = out_width(q), out_width(k), out_width(v)
    return Attention(*widths, sum(widths), False)


def _latent(q: int, a: Tensor, b: Tensor, heads: int | None) -> Attention:
    """transformers caches a latent attention's keys and values expanded per head: keys as wide as the
    queries (heads x (nope + rope)), values heads x v_head_dim, where kv_b outputs heads x (nope + v_head_dim)
    from the latent of kv_a's output less its rope part (kv_b's input width)."""
    a_out, b_out, latent = out_width(a), out_width(b), in_width(b)
    k = v = None
    if heads is not None and q % heads == 0:
        rope = a_out - latent
        nope = q // heads - rope
        k, v = q, b_out - heads * nope
    return Attention(q, k, v, q + a_out + b_out + q, False, (a_out, b_out))


def _mlp(m: dict[str, Tensor]) -> Mlp | None:
    fused = next((m[n] for n in _FUSED_MLP if n in m), None)
    if fused is not None:
        return Mlp("fused", out_width(fused) // 2)
    gate = next((m[n] for n in _GATE if n in m), None)
    up = next((m[n] for n in _UP if n in m), None)
    if gate is not None and up is not None:
        return Mlp("gated", out_width(up))
    plain = next((m[n] for n in _PLAIN_UP | _UP if n in m), None)
    return Mlp("plain", out_width(plain)) if plain is not None else None


def _experts(routed: list[Tensor], moe: MoeSpec | None) -> Experts | None:
    """The routed experts' widths: from a 3-D gate_up ``[E, 2I, H]`` (or ``w13``), a 3-D up/gate, or the
    first expert's own modules; top-k from the layer's ``moe`` (none: every token to every expert, the most
    a layer can compute)."""
    if not routed:
        return None
    by_module: dict[str, Tensor] = {}
    for t in routed:
        by_module.setdefault(module_of(t.name), t)
    fused = next((by_module[n] for n in _FUSED_MLP if n in by_module), None)
    if fused is not None:
        inner, hidden = out_width(fused) // 2, in_width(fused)
        count = fused.shape[0] if len(fused.shape) == 3 else None
    else:
        up = next((by_module[n] for n in (*_UP, *_GATE, *_PLAIN_UP) if n in by_module), routed[0])
        inner, hidden = out_width(up), in_width(up)
        count = up.shape[0] if len(up.shape) == 3 else None
    stacked = count is not None
    if count is None:  # one module per expert: count their numbers (``experts.3.w1``)
        count = len({_expert_number(t.name) for t in routed} - {None}) or 1
    experts = moe.experts if moe is not None else count
    return Experts(experts, moe.top_k if moe is not None else experts, inner, hidden, stacked)


def _expert_number(rel: str) -> str | None:
    """``3`` of ``block_sparse_moe.experts.3.w1.weight``: the number after the experts container."""
    parts = rel.split(".")
    return next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p.lower().endswith("experts")
                 and parts[i + 1].isdigit()), None)
