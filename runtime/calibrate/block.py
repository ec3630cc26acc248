"""A decoder block beyond its matrices' roofline: attention's arithmetic and the elementwise work at a prefill
(``attention_tflops``, ``elementwise_bytes``), the fixed GPU time of its small kernels in CUDA graph replay
(``block_gpu_us``, ``moe_block_gpu_us``), its matrices' read rate by the rows of a decode batch
(``matmul_gbps_rows``), and attention's read of a KV cache (``kv_read_gbps``)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

from runtime.calibrate.cpu import _by_depth, _has_transformers, _per_block_us, tiny_llama, tiny_moe
from runtime.calibrate.timers import gpu_ms, graph_ms
from schemas.hardware_profile import RatePoint, elementwise_ms

# a decoder block: hidden, intermediate, query heads, key/value heads, head dim (Llama-3-8B's)
LLAMA_8B_BLOCK = (4096, 14336, 32, 8, 128)


# The MoE block ``moe_block_gpu_us`` is measured on: Qwen3-MoE's hidden size, heads and expert width, top-8 of 16
# experts (a token touches eight, as in the real model; the count of experts moves the floor by at most 6 us
# between 8 and 256, nor do 2 or 8 choices: bench/probe_replay_kernels.py --moe-decode, 2026-12-02). A tiny MoE's
# block (hidden 64) gave 150 us where the Qwen3-MoE shape's block takes 217 beyond its roofline: its kernels work
# on real activations, and its grouped expert matmul reads 8 experts at 1.6 TB/s, not at a GEMV's rate.
MOE_FLOOR_SHAPE = dict(vocab_size=256, hidden_size=2048, intermediate_size=6144, num_attention_heads=32,
                       num_key_value_heads=4, head_dim=128, num_experts=16, num_experts_per_tok=8,
                       moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[])


MOE_FLOOR_BLOCKS = (4, 12)  # its depths (12 blocks: 2.3 GB in bf16)


def built(make: Callable[[], torch.nn.Module], device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The module ``make`` builds, made in ``dtype`` on ``device`` (not built on the host and moved)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return make()
    finally:
        torch.set_default_dtype(old)


def moe_block_bytes(shape: dict, itemsize: int = 2) -> tuple[int, int]:
    """The weights one token's decode step reads in an MoE block of ``shape``, as the cost model's roofline reads
    them: (its attention's four matrices and the router, at ``gpu_mem_gbps``; the ``num_experts_per_tok``
    experts it picks, three matrices each, at ``expert_gbps``)."""
    hidden, heads, kv_heads, head_dim = (shape[k] for k in ("hidden_size", "num_attention_heads",
                                                            "num_key_value_heads", "head_dim"))
    dense = hidden * head_dim * (2 * heads + 2 * kv_heads) + shape["num_experts"] * hidden
    experts = shape["num_experts_per_tok"] * 3 * hidden * shape["moe_intermediate_size"]
    return dense * itemsize, experts * itemsize


def block_gpu_floor(device: torch.device, timer: Callable[[Callable[[], object]], float] | None = None,
                    gpu_mem_gbps: float = float("inf"), moe_shape: dict | None = None,
                    expert_gbps: float | None = None) -> dict[str, float]:
    """``block_gpu_us`` and ``moe_block_gpu_us``: the GPU time one more decoder block adds to a decode step
    replayed as a CUDA graph beyond its weights' reads (at ``gpu_mem_gbps``): what the cost model's roofline
    misses, which every block pays. Dense: a tiny transformers Llama (20 blocks less 4, over 16), whose bytes and
    flops are nothing, so what is left is its kernels' fixed times (on the H200 a graph-replayed decode of the
    Llama-3-8B shape took 1.84 ms more than its weights' reads, 57 us a block; the tiny model 66). MoE: a
    Qwen3-MoE block of ``moe_shape`` (``MOE_FLOOR_SHAPE``), less its reads (``moe_block_bytes``; the experts at
    ``expert_gbps``, else ``gpu_mem_gbps``)."""
    timer = timer or graph_ms
    if not _has_transformers():
        return {}
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    shape = moe_shape or MOE_FLOOR_SHAPE

    def step_ms(model: torch.nn.Module) -> float:
        model = model.to(device, dtype).eval()
        with torch.inference_mode():
            return timer(lambda: model(ids, use_cache=False))

    def moe_ms(layers: int) -> float:
        # made in its dtype where it runs (on the host, 12 full-width blocks are slow)
        model = built(lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=layers, **shape)), device, dtype)
        ms = step_ms(model)
        del model
        return ms

    figures = {"block_gpu_us": max(0.0, _per_block_us(_by_depth(step_ms, tiny_llama)))}
    few, many = MOE_FLOOR_BLOCKS
    try:
        moe_per_block = (moe_ms(many) - moe_ms(few)) / (many - few) * 1e3
    except torch.cuda.OutOfMemoryError:
        # a small GPU (the 12 blocks take 2.3 GB): the tiny MoE's floor, which misses what a
        # block of real width adds (docs/DESIGN.md, "A block's GPU floor")
        gc.collect()
        torch.cuda.empty_cache()
        figures["moe_block_gpu_us"] = max(0.0, _per_block_us(_by_depth(step_ms, tiny_moe)))
        return figures
    dense, experts = moe_block_bytes(shape, torch.empty((), dtype=dtype).element_size())
    reads = (dense / gpu_mem_gbps + experts / (expert_gbps or gpu_mem_gbps)) / 1e3
    figures["moe_block_gpu_us"] = max(0.0, moe_per_block - reads)
    return figures


def kv_read(device: torch.device, batch: int = 32, heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
            context: int = 4096, timer: Callable[[Callable[[], object]], float] | None = None) -> dict[str, float]:
    """``kv_read_gbps``: scaled dot-product attention of one decode step over a ``context``-token KV cache
    (Llama-3-8B's heads, ``batch`` sequences), replayed as a CUDA graph: the cache's bytes / the time (4,091 GB/s
    on the H200, 4,180 with Phi-3-mini's 32 KV heads, where a GEMV reads weights at 2,335-2,846: 2026-12-02)."""
    timer = timer or graph_ms
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.randn(batch, heads, 1, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(batch, kv_heads, context, head_dim, dtype=dtype, device=device) for _ in range(2))
    with torch.inference_mode():
        ms = timer(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != heads))
    return {"kv_read_gbps": 2 * k.numel() * k.element_size() / ms / 1e6}


def llama_block(device: torch.device, shape: tuple[int, int, int, int, int]):
    """A transformers Llama decoder block of ``shape`` (SDPA attention, random weights, bf16 on a GPU) and its rotary
    embedding, on ``device``: (layer, rotary, dtype); None without transformers."""
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    except ImportError:
        return None
    hidden, inter, heads, kv_heads, head_dim = shape
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=head_dim, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    layer = LlamaDecoderLayer(config, layer_idx=0).to(device, dtype).eval()
    return layer, LlamaRotaryEmbedding(config).to(device), dtype


def block_compute(device: torch.device, matmul_tflops: float, gpu_mem_gbps: float,
                  shape: tuple[int, int, int, int, int] = LLAMA_8B_BLOCK, tokens: int = 2048,
                  timer: Callable[[Callable[[], object]], float] | None = None) -> dict[str, float]:
    """What a decoder block computes beyond its matmuls: ``attention_tflops`` and ``elementwise_bytes``, timed
    queued (``gpu_ms(queued=True)``: the GPU's time alone; a block issued as it runs is CPU-bound in part and
    gave 25.9-34.7 bytes where queued gave 17.0 on the H200, 2026-12-02, bench/probe_uva_experts.py)."""
    timer = timer or (lambda fn: gpu_ms(fn, queued=True))
    built = llama_block(device, shape)
    if built is None:
        return {}
    layer, rotary, dtype = built
    hidden, inter, heads, kv_heads, head_dim = shape
    x = torch.randn(1, tokens, hidden, dtype=dtype, device=device)
    positions = torch.arange(tokens, device=device)[None]
    q = torch.randn(1, heads, tokens, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(1, kv_heads, tokens, head_dim, dtype=dtype, device=device) for _ in range(2))
    with torch.inference_mode():
        cos_sin = rotary(x, positions)
        block = timer(lambda: layer(x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin))
        attention = timer(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                   enable_gqa=True))
    flops = 4.0 * tokens * (tokens + 1) / 2 * heads * head_dim
    itemsize = torch.empty((), dtype=dtype).element_size()
    matrices = _block_matrices(shape)
    # the roofline of planner/cost/layer.py for a resident matrix: flops at the matmul rate or bytes at memory's (at
    # a prefill's rows the flops outlast the reads at any read rate, so ``matmul_gbps_rows``, measured after this,
    # would not move it)
    matmul = sum(max(2.0 * tokens * r * c / (matmul_tflops * 1e9), r * c * itemsize / gpu_mem_gbps / 1e6)
                 for r, c in matrices)
    rest = max(0.0, block - matmul - attention)
    outputs = sum(r for r, _ in matrices)
    return {"attention_tflops": flops / attention / 1e9,
            "elementwise_bytes": rest / elementwise_ms(tokens, outputs, 1.0, gpu_mem_gbps)}  # a byte's time, inverted


# the rows (sequences of one token) at which ``block_reads`` replays the Llama-3-8B block: decode batches, below where
# its flops outlast its reads
DENSE_ROWS = (1, 8, 16, 32, 64, 128)


def _block_matrices(shape: tuple[int, int, int, int, int]) -> list[tuple[int, int]]:
    """A Llama decoder block's matrices (q, k, v, o, gate, up, down) as (out, in)."""
    hidden, inter, heads, kv_heads, head_dim = shape
    return [(heads * head_dim, hidden), (kv_heads * head_dim, hidden), (kv_heads * head_dim, hidden),
            (hidden, heads * head_dim), (inter, hidden), (inter, hidden), (hidden, inter)]


def read_by_rows(block_bytes: float, block_ms: dict[int, float], floor_us: float,
                 elementwise_ms: dict[int, float]) -> list[RatePoint]:
    """``matmul_gbps_rows``: the block's matrices' bytes over what its replayed time at each of ``DENSE_ROWS`` rows
    leaves after the block floor and the elementwise work the cost model counts beside the matmuls (so that the
    model, adding them back, gives the time measured)."""
    points = []
    for rows in DENSE_ROWS:
        reads_ms = block_ms[rows] - floor_us / 1e3 - elementwise_ms[rows]
        points.append(RatePoint(tokens=rows, gbps=round(block_bytes / max(reads_ms, 1e-6) / 1e6, 3)))
    return points


# the depths of the full-width model whose replays ``block_reads`` takes the difference of: a block as the model runs
# it under capture, with the attention mask the model builds there (one layer called alone with no mask ran flash
# attention where the captured model ran cutlass's memory-efficient kernel: 34 us a block at 32 rows against 7,
# 2026-12-02, bench/probe_replay_kernels.py --decode-rows)
REPLAY_BLOCKS = (2, 6)


def block_reads(device: torch.device, floor_us: float, elementwise_bytes: float, gpu_mem_gbps: float,
                shape: tuple[int, int, int, int, int] = LLAMA_8B_BLOCK,
                timer: Callable[[Callable[[], object]], float] | None = None) -> dict[str, object]:
    """``matmul_gbps_rows``: a decoder block of ``shape`` (resident) in a transformers Llama replayed as a CUDA graph
    at a decode step of ``DENSE_ROWS`` sequences: the rate its matmuls read their weights at, by rows. A block is the
    difference between the model at ``REPLAY_BLOCKS`` depths over the blocks between, so it pays what the model's
    own forward makes it pay (the mask it builds under capture). The weights of a decode batch are read slower than
    a lone GEMV's (the H200 replayed the 8B shape's decode step at 32 tokens in 9.0 ms, at 1 in 7.1, 2026-12-02;
    its seven matmuls queued alone slowed 2% from 1 to 32 rows and an 8192x8192 GEMV read at 3.7 TB/s, so neither
    a lone matrix nor a lone block of matmuls holds what the model pays)."""
    timer = timer or graph_ms
    if not _has_transformers():
        return {}
    hidden, inter, heads, kv_heads, head_dim = shape
    config = dict(vocab_size=256, hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=head_dim)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    by_depth: dict[int, dict[int, float]] = {rows: {} for rows in DENSE_ROWS}
    for depth in REPLAY_BLOCKS:
        model = built(lambda: tiny_llama(depth, config), device, dtype).eval()
        with torch.inference_mode():
            for rows in DENSE_ROWS:
                ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
                by_depth[rows][depth] = timer(lambda m=model, ids=ids: m(ids, use_cache=False))
        model = None  # freed before the deeper one is built
    few, many = REPLAY_BLOCKS
    block_ms = {rows: (t[many] - t[few]) / (many - few) for rows, t in by_depth.items()}
    matrices = _block_matrices(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    outputs = sum(r for r, _ in matrices)
    elementwise = {rows: elementwise_ms(rows, outputs, elementwise_bytes, gpu_mem_gbps) for rows in DENSE_ROWS}
    block_bytes = sum(r * c for r, c in matrices) * itemsize
    return {"matmul_gbps_rows": read_by_rows(block_bytes, block_ms, floor_us, elementwise),
            "raw_block_ms": block_ms, "raw_block_depth_ms": by_depth}
