"""What a decoder block computes besides its matrices' matmuls (the roofline of planner/cost/layer.py):
attention's own arithmetic over the context, and the elementwise work between the matmuls.

- Attention: a forward's tokens belong to ``sequences`` (``Sequences``); each pushes ``q = tokens /
  sequences`` new tokens over the ``context`` tokens its KV cache already holds, causally:
  ``q·context + q(q+1)/2`` query-key pairs a sequence, each ``4·width`` flops (Q·Kᵀ and the weighted sum
  of V; ``width`` = heads × head_dim, the query projection's output), at the profile's
  ``attention_tflops``. Its keys and values (the key and value projections' output per token, in their
  dtype) are read once a sequence from GPU memory. The time is the larger of the two (a roofline): the
  arithmetic at a long prefill, the KV cache at a decode over a long context.
- A step over cached tokens of a grouped-query model (fewer KV heads than query heads), as transformers (5.17)
  runs it with its static cache (``sdpa``): the cache returns every one of its ``context`` slots and the step
  passes SDPA a mask, so ``repeat_kv`` first copies the keys and values out for every query head (a copy of a
  broadcast view: it reads the cache once and writes ``2 x query`` elements a token), at the profile's
  ``strided_copy_gbps`` (bytes read + written: PyTorch's element-by-element copy of a non-contiguous view, not
  the vectorized copy of a contiguous one), and SDPA then reads those copies at ``gpu_mem_gbps`` instead of the
  cache (planner/memory/activations.py counts the copies' memory).
- A forward of several tokens a sequence captured as a CUDA graph (``mode: graph``): transformers cannot read the
  padding mask while a stream captures, so it does not leave the mask out for SDPA's own causal kernel; it
  passes SDPA an explicit mask, whose attention computes every query-key pair of the square (not the causal
  half) and, in a grouped-query model, reads keys and values repeated for every query head (``repeat_kv``, as
  above). Measured on the H200 (bench/probe_replay_kernels.py, 2026-12-02): the Llama-3-8B shape's prefill of
  2,048 tokens replayed ran SDPA's kernel 2.5x as long (7.1 against 2.8 ms a forward) and 64 copies more (1.6
  ms) than the same forward's kernels run eagerly; the matmuls alike to 1%. A decode step (one token a
  sequence) attends the same pairs either way.
- Elementwise: norms, rotary embedding, activation and residual adds move ``elementwise_bytes`` of GPU
  memory per token for each output element of the block's matrices (routed experts: the top-k a token
  uses), at ``gpu_mem_gbps``. ``planner calibrate`` measures it on a transformers Llama block as what the
  roofline of its matmuls and attention leaves unexplained.

A block is a layer with 4 or more matrices or with routed experts (as for the CPU cost in
planner/cost/layer.py). Its query, key and value projections are found by name: ``q_proj``, ``k_proj``,
``v_proj`` (and ``query``/``key``/``value``, ``wq``/``wk``/``wv``), fused ``qkv_proj``,
``query_key_value``, ``Wqkv``, ``W_pack``, ``c_attn`` (a third each), and MLA's ``q_b_proj`` and
``kv_a_proj_with_mqa`` (the compressed cache); a block without them has no attention cost.

A workload item's sequences and context (schemas/workload.py: ``batch``, ``context``, what a sequence holds
after the forward) give ``Sequences``: ``sequences_of``. Without a context, its batch if it gives one (else one
sequence of all its tokens), none holding earlier tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from schemas.hardware import HardwareProfile
from schemas.hardware_profile import elementwise_ms
from schemas.plan_content import PlanParam

_QUERY = {"q_proj", "query", "wq", "q_b_proj"}
_KEY_VALUE = {"k_proj", "v_proj", "key", "value", "wk", "wv", "kv_a_proj_with_mqa"}
_FUSED = {"qkv_proj", "query_key_value", "wqkv", "w_pack", "c_attn"}


@dataclass(frozen=True)
class Sequences:
    """How a forward's tokens split into sequences, and the tokens each already holds in its KV cache."""

    count: int = 1
    context: int = 0
    captured: bool = False  # the forward runs in CUDA graph replay (SDPA is passed an explicit mask)


ONE = Sequences()


def sequences_of(item, name: str = "") -> Sequences:
    """A workload item's sequences (``schemas.workload.batch_of``: its batch, else one a token for a decode step
    and one for a prefill) and the tokens each held before the forward: its ``context`` (what a sequence holds
    after it) less the tokens the forward adds; without a context, none."""
    from schemas.workload import batch_of

    captured = getattr(item, "mode", "eager") == "graph"
    if getattr(item, "context", None) is None:  # as before workloads had contexts: its batch, if it gives one
        given = item.batch if isinstance(item.batch, int) else 1
        return Sequences(max(1, min(given, item.rows)), 0, captured)
    batch = batch_of(name, item)
    return Sequences(batch, max(0, item.context - -(-item.rows // batch)), captured)


@dataclass(frozen=True)
class BlockShape:
    query: int  # query features a token has (heads x head_dim); 0: no attention found
    kv_bytes: float  # key and value bytes a token keeps in the cache
    outputs: float  # output elements of the block's matrices a token produces
    repeated_bytes: float = 0.0  # grouped-query attention: its keys and values repeated for every query head


def block_shape(params: Iterable[tuple[str, PlanParam, str]], moe: tuple[int, int] | None) -> BlockShape:
    """The shape of a block from its (name relative to it, param, role) triples; roles as planner/cost/layer.py."""
    query = 0
    kv = 0.0
    outputs = 0.0
    item = 0.0
    for rel, p, role in params:
        if role not in ("matmul", "routed") or len(p.shape) < 2:
            continue
        rows = p.shape[-2] if len(p.shape) >= 3 else p.shape[0]
        if role == "routed" and moe is not None:
            experts, top_k = moe
            outputs += rows * top_k / (1 if len(p.shape) >= 3 else experts)
            continue
        outputs += rows
        names = {s.lower() for s in rel.split(".")}
        itemsize = p.bytes / max(math.prod(p.shape), 1)
        if names & _QUERY:
            query += rows
            item = item or itemsize
        elif names & _KEY_VALUE:
            kv += rows * itemsize
        elif names & _FUSED:
            query += rows // 3
            kv += (rows - rows // 3) * itemsize
            item = item or itemsize
    repeated = 2 * query * item if query and kv < 2 * query * item else 0.0
    return BlockShape(query, kv, outputs, repeated)


def block_ms(shape: BlockShape, tokens: int, seqs: Sequences, hw: HardwareProfile) -> float:
    """GPU time of a block's attention arithmetic and elementwise work at ``tokens`` in ``seqs``."""
    elementwise = elementwise_ms(tokens, shape.outputs, hw.elementwise_bytes, hw.gpu_mem_gbps)
    if not shape.query:
        return elementwise
    q = tokens / seqs.count
    masked = seqs.captured and q > 1  # SDPA given a mask: the whole square, keys and values repeated
    pairs = seqs.count * (q * (seqs.context + q) if masked else q * seqs.context + q * (q + 1) / 2)
    flops = 4.0 * pairs * shape.query
    held = seqs.count * (seqs.context + q)  # cached tokens attended to, the new ones included
    if (seqs.context or masked) and shape.repeated_bytes:  # repeat_kv copies them, SDPA reads the copies
        repeat = held * (shape.kv_bytes + shape.repeated_bytes) / hw.strided_copy_gbps / 1e6
        read = held * shape.repeated_bytes
    else:
        repeat, read = 0.0, held * shape.kv_bytes
    rate = hw.kv_read_gbps or hw.gpu_mem_gbps
    return repeat + max(flops / (hw.attention_tflops * 1e9), read / rate / 1e6) + elementwise
