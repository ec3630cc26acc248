"""The activations' peak of one forward: the largest set of tensors alive at once, from the spec's shapes.

Modeled on transformers' eager modules with SDPA attention (no score matrix is kept: flash or
memory-efficient kernels) and its grouped-matmul experts, as they were read (transformers 5) and measured
tensor by tensor on the CPU. With T the forward's tokens, H the model's width and every figure in the
activations' dtype unless said:

- through every block: the embedding's output (the model keeps ``inputs_embeds``) and the block's input,
  ``2·T·H``;
- a norm: its input, output and two float32 tensors of ``T·H`` (RMSNorm computes in float32);
- attention: the normed input, the projections' outputs (q, k and v; a fused projection's whole output)
  and the rotary embedding's temporaries, three query-sized tensors (four with a fused projection, whose
  views keep its output alive); with a KV cache, a dynamic cache's growth: it copies one layer's keys
  (or values) into a longer tensor, ``batch·context`` rows of the wider of the two, in the cache's dtype;
  or, where the forward attends to cached tokens beyond its own (a decode step) with fewer KV heads than
  query heads, the keys and values of one layer repeated for every query head (``2·batch·context·q``):
  transformers (5.17) passes SDPA a mask there, which its grouped-query path does not take, so ``repeat_kv``
  copies them (later versions that leave the mask out need less: the figure is then an upper bound); and one
  layer's keys and values once more, which the H200 measured beside them for the Qwen3-MoE shape (its source
  not found; for Llama-3-8B the figure is then 2% over);
- an MLP: its input and the residual, then gate and up outputs and their product (``3·T·I``); a fused
  gate_up's output with the activation and the product (``4·T·I``); a plain MLP's two (``2·T·I``);
- routed experts: every token goes to its ``top_k`` experts, ``S = T·k`` rows: the gathered inputs and
  the up projection's output or four ``S·H`` tensors while the outputs are weighted and put back in order,
  whichever is larger, or, where the runtime pads the grouped call to torch's tall tiles (``S'`` rows,
  schemas/grouped_tiles.py: 64-128 rows an expert, at most twice ``S``), the gathered inputs, their padded
  copy and the padded up output (``S·H + S'·(H + 2I)``); the router's logits, their float32 softmax and the
  int64 ids that sort the rows by expert; shared experts run beside them with the routed output kept;
- the LM head: the normed hidden state and the logits, ``R·V`` for the R rows the forward returns (every
  token's, or each sequence's last as ``generate()`` asks for, which also keeps a float32 copy and the
  processed scores, 8 bytes a logit);
- in ``generate()`` (logits ``last``), through every stage: its token ids, attention mask and positions,
  int64 for every token of every sequence, about six such tensors at once as it extends them, and the
  previous step's float32 scores (``batch·V·4``, measured on the H200 beside the next forward).

The peak is the largest of these, not their sum; the KV cache itself is a part of its own
(``planner.memory.kv``). Another runtime (a fused kernel, an engine) allocates differently: the spec's
``memory.activations`` replaces the figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.memory.kv import KvSize
from planner.memory.shapes import Experts, LayerShape, Mlp
from schemas.grouped_tiles import padded_rows

FLOAT32 = 4
INDEX = 8  # int64
GENERATE_SCORES = 8  # bytes a logit that generate() keeps beside the logits: a float32 copy and the scores
GENERATE_IDS = 6  # batch x sequence int64 tensors generate() holds at once (ids, mask, positions, their copies)


@dataclass(frozen=True)
class Forward:
    """What one forward pushes: ``tokens`` rows in ``batch`` sequences of ``context`` cached tokens each."""

    tokens: int
    batch: int
    context: int  # 0: no KV cache
    logits: str  # all | last


@dataclass(frozen=True)
class Peak:
    bytes: int
    where: str  # the layer and the stage where the activations peak


def model_width(shapes: Sequence[LayerShape]) -> int:
    """H: the input embedding's width, else the first block's input width."""
    for s in shapes:
        if s.lookup:
            return s.lookup
    return next((s.hidden or (s.experts.hidden if s.experts else 0) for s in shapes if s.block), 0)


def activation_peak(shapes: Sequence[LayerShape], forward: Forward, dt: int, kv: KvSize | None) -> Peak:
    """The largest live set of activations of ``forward`` through the layers ``shapes``, with activations of
    ``dt`` bytes an element; ``kv``: the KV cache's size, for a dynamic cache's growth."""
    t, h = forward.tokens, model_width(shapes)
    vocab = max((s.head or 0 for s in shapes), default=0)
    best = Peak(0, "no layer computes anything this model recognizes")
    for s in shapes:
        for stage, nbytes in _stages(s, forward, t, h, dt, kv, vocab):
            if nbytes > best.bytes:
                best = Peak(nbytes, f"{s.name}: {stage}")
    return best


def _stages(s: LayerShape, f: Forward, t: int, h: int, dt: int, kv: KvSize | None, vocab: int):
    carried = 2 * t * h * dt  # the embedding's output and the block's input
    if f.logits == "last":  # generate()'s token ids, mask and positions as it extends them, the last step's scores
        carried += GENERATE_IDS * f.batch * max(f.context, -(-t // f.batch)) * INDEX + f.batch * vocab * FLOAT32
    if s.block:
        yield "norm", carried + t * h * dt + 2 * t * h * FLOAT32
    a = s.attention
    if a is not None:
        rotary = (4 if a.fused else 3) * t * a.q
        cached = f.batch * f.context if (kv is not None and f.context) else 0
        grow = cached * kv.widest if kv is not None else 0
        attends_to_cache = f.context > -(-t // f.batch)
        grouped = a.k is not None and a.k < a.q
        # repeated for each query head, and one layer's keys and values more (measured on the H200 for a
        # Qwen3-MoE shape, 8 query heads a KV head; not for Llama's 4: counted for every grouped model)
        expand = (2 * a.q + a.k + a.v) * cached * dt if attends_to_cache and grouped else 0  # type: ignore[operator]
        yield "attention", carried + (t * h + t * a.outputs + rotary) * dt + max(grow, expand)
    inner = carried + 2 * t * h * dt  # an MLP's input and the residual
    if s.mlp is not None:
        yield f"mlp ({_mlp_words(s.mlp)})", inner + _mlp_bytes(s.mlp, t, dt)
    e = s.experts
    if e is not None:
        rows = t * e.top_k
        routed = routed_bytes(e, t, dt)
        router = t * e.experts * (dt + FLOAT32) + rows * INDEX * 3  # logits, softmax; sorted ids, order
        shared = t * h * dt + _mlp_bytes(s.shared, t, dt) if s.shared is not None else 0
        yield f"routed experts ({e.top_k} of {e.experts} a token)", inner + max(routed, shared) + router
    elif s.shared is not None:
        yield f"shared experts ({_mlp_words(s.shared)})", inner + _mlp_bytes(s.shared, t, dt)
    if s.head:
        rows = f.batch if f.logits == "last" else t
        kept = rows * s.head * GENERATE_SCORES if f.logits == "last" else 0
        yield f"logits ({rows} x {s.head})", (t * h + rows * s.head) * dt + kept


def routed_bytes(e: Experts, t: int, dt: int) -> int:
    """The routed experts' own activations at ``t`` tokens (the module docstring): the larger of the gathered
    inputs with the up projection's output, four ``S·H`` tensors, or the padded call's."""
    rows = t * e.top_k
    padded = padded_rows(rows, e.experts)  # the runtime's call for experts on UVA (runtime/expert_math.py)
    return max(rows * (e.hidden + 4 * e.inner), 4 * rows * e.hidden,
               rows * e.hidden + padded * (e.hidden + 2 * e.inner) if padded > rows else 0) * dt


def _mlp_bytes(m: Mlp, t: int, dt: int) -> int:
    return {"gated": 3, "fused": 4, "plain": 2}[m.kind] * t * m.inner * dt


def _mlp_words(m: Mlp) -> str:
    return {"gated": "gate, up and their product", "fused": "gate_up, its activation and the product",
            "plain": "up and its activation"}[m.kind]
