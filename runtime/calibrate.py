"""Measure a hardware profile on the local GPU (``planner calibrate``): link, UVA, memory,
matmul and eager-PyTorch CPU costs, in well under a minute.

Every figure is the median of several CUDA-event (GPU work) or wall-clock (CPU issue) timings:
- ``h2d_gbps``: pinned host -> GPU copies of 256 MiB;
- ``uva_gbps``, ``uva_call_ms``, ``uva_passes``: ``x @ W.T`` with an 8192x8192 weight read through a UVA view
  of pinned host memory, at 1 ... 4096 tokens, and at 1 token with a 1024x4096 one: the line through the two
  1-token reads gives the rate and the fixed time a matmul pays beyond its bytes; passes = bytes read
  ((time - fixed) x UVA rate) / weight bytes;
- ``link_shared_gbps``: a 1 GiB pinned copy on one stream and a 1-token matmul reading another 1 GiB
  weight through UVA on a second stream, started together: 2 GiB / the time until both are done (the
  copy engine and UVA reads share the one host link: docs/DESIGN.md, "Cost model");
- ``gpu_mem_gbps``: the same matmul at 1 token with the weight in GPU memory (a memory-bound GEMV);
- ``matmul_tflops``: the same matmul at 4096 tokens in GPU memory;
- ``launch_us``: CPU time per small eager kernel; ``copy_call_us``: per small async copy;
- ``block_cpu_us``, ``moe_block_cpu_us``, ``expert_cpu_us``, ``moe_sync``: tiny transformers
  Llama and Qwen3-MoE models (when transformers is installed): the CPU time one more dense or MoE
  decoder block, or one more routed expert per token, adds to an eager forward; a cost per expert
  means the MoE block loops over experts (and reads the routing back first: ``moe_sync``);
- ``uva_expert_call_ms``, ``uva_expert_passes``, ``expert_tflops`` (and by rows), ``expert_gbps``: a Qwen3-MoE experts module
  with its weights resident, then read through UVA: the time beyond the bytes it reads per grouped expert
  matmul, its re-reads of the experts by the rows each sees (uniform random routing), its compute rate at the
  most rows, and its read rate from GPU memory by the experts touched;
- ``attention_tflops``, ``elementwise_bytes``: a transformers Llama decoder layer of Llama-3-8B's shape
  (resident) at 2,048 tokens, and scaled dot-product attention alone at its shape (causal): the attention's
  flops / its time; and what the layer's time leaves after its matmuls' roofline (at the figures measured
  above) and the attention, as bytes at ``gpu_mem_gbps`` per token and output element of its matrices
  (planner/cost/block.py reads them back the same way);
- ``block_gpu_us``, ``moe_block_gpu_us``: a decode step replayed as a CUDA graph, of the tiny Llama and of a
  Qwen3-MoE of real width (``MOE_FLOOR_SHAPE``): the GPU time one more block adds beyond its weights' reads
  (its kernels' fixed times; ``block_gpu_floor``);
- ``kv_read_gbps``: scaled dot-product attention of a decode step over a 4,096-token KV cache (32 sequences,
  Llama-3-8B's heads) replayed as a CUDA graph: the cache's bytes / its time (``kv_read``);
- ``host_*``: the host CPU's routed-expert kernel for the cpu backend (runtime/calibrate_host.py);
- ``workspace_bytes``: what a matmul and an attention leave allocated on a fresh stream beyond their
  outputs (cuBLAS's workspace), the allowance every plan's peak counts.
"""

from __future__ import annotations

import datetime
import gc
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from runtime.calibrate_host import host_experts
from runtime.timing import wall_ms
from runtime.uva import device_view
from schemas.hardware_profile import HardwareProfile, UvaPoint

TOKENS = (1, 16, 64, 256, 1024, 2048, 4096)


QUEUE_CYCLES = 50_000_000  # GPU clock cycles (about 25 ms) a queued timing holds the stream for before ``fn``


def gpu_ms(fn: Callable[[], object], repeat: int = 10, warmup: int = 2, queued: bool = False) -> float:
    """Median milliseconds of ``fn()`` on the current stream, measured with CUDA events after
    ``warmup`` untimed runs (the events order it after them, so no host sync is needed). ``queued``: the
    stream first sleeps while the CPU issues all of ``fn``, so its kernels run back to back and the CPU's
    issue time is not in the figure (a decoder block issues about as long as its GPU work takes: timed as it
    is issued, its elementwise work came out twice the forward's, 2026-12-02)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queued:
            torch.cuda._sleep(QUEUE_CYCLES)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _wall_ms(fn: Callable[[], object], repeat: int = 15, warmup: int = 3) -> float:
    """CPU-bound wall time: the median of ``repeat`` runs (as the benchmarks report), each waited for on the
    GPU, with the garbage collector held off."""
    return wall_ms(fn, repeat, warmup, sync=torch.cuda.synchronize, hold_gc=True)


def link(device: torch.device) -> dict[str, float]:
    n = 256 * 2**20
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    ms = gpu_ms(lambda: dev.copy_(host, non_blocking=True))
    return {"h2d_gbps": n / ms / 1e6}


def _two_streams_ms(first: Callable[[], object], second: Callable[[], object], repeat: int = 5) -> float:
    """Median milliseconds from launching ``first`` and ``second`` together, each on its own stream, until
    both are done (events on the current stream: the streams wait for its start and it waits for both)."""
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    times = []
    for i in range(repeat + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        here = torch.cuda.current_stream()
        start.record(here)
        for stream, fn in zip(streams, (first, second)):
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                fn()
        for stream in streams:
            here.wait_stream(stream)
        end.record(here)
        end.synchronize()
        if i:  # the first run warms up
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def shared_link(device: torch.device) -> dict[str, object]:
    """A pinned copy and a UVA read of equal bytes at once: their bytes together / the time both take (and,
    in ``raw_link``, each alone and both, ms)."""
    n = 2**30
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    w_host = torch.empty(n // 2 // 8192, 8192, dtype=torch.bfloat16).pin_memory()
    w_uva = device_view(w_host, device)
    x = torch.randn(1, 8192, dtype=torch.bfloat16, device=device)

    def copy() -> None:
        dev.copy_(host, non_blocking=True)

    def read() -> None:
        x @ w_uva.T

    both = _two_streams_ms(copy, read)
    raw = {"bytes": n, "copy_ms": gpu_ms(copy, repeat=5), "read_ms": gpu_ms(read, repeat=5), "both_ms": both}
    return {"link_shared_gbps": 2 * n / both / 1e6, "raw_link": raw}


SMALL_UVA = (1024, 4096)  # a small matrix read through UVA (Llama-3-8B's key projection): the fixed cost's witness


def uva_line(big_bytes: int, big_ms: float, small_bytes: int, small_ms: float) -> tuple[float, float]:
    """(GB/s, fixed ms) of a UVA read taking ``fixed + bytes / rate``, through two measured reads (the big one's
    rate alone when the small one is not slower per byte: no fixed cost to find)."""
    if big_ms <= small_ms or big_bytes <= small_bytes:
        return big_bytes / big_ms / 1e6, 0.0
    gbps = (big_bytes - small_bytes) / (big_ms - small_ms) / 1e6
    fixed = small_ms - small_bytes / gbps / 1e6
    return (gbps, fixed) if fixed > 0.0 else (big_bytes / big_ms / 1e6, 0.0)


def matmuls(device: torch.device) -> dict[str, object]:
    dim = 8192
    w_host = torch.randn(dim, dim, dtype=torch.bfloat16).pin_memory()
    w_uva = device_view(w_host, device)
    w_gpu = w_host.to(device)
    nbytes = w_host.numel() * w_host.element_size()
    uva_ms, resident_ms = {}, {}
    for t in TOKENS:
        x = torch.randn(t, dim, dtype=torch.bfloat16, device=device)
        uva_ms[t] = gpu_ms(lambda x=x: x @ w_uva.T, repeat=5)
        resident_ms[t] = gpu_ms(lambda x=x: x @ w_gpu.T)
    s_host = torch.randn(*SMALL_UVA, dtype=torch.bfloat16).pin_memory()
    s_uva = device_view(s_host, device)
    x = torch.randn(1, SMALL_UVA[1], dtype=torch.bfloat16, device=device)
    small_ms = gpu_ms(lambda: x @ s_uva.T)
    uva_gbps, fixed = uva_line(nbytes, uva_ms[1], s_host.numel() * s_host.element_size(), small_ms)
    points = [UvaPoint(tokens=t, passes=round(max(1.0, (uva_ms[t] - fixed) * uva_gbps * 1e6 / nbytes), 3))
              for t in TOKENS]
    big = TOKENS[-1]
    return {"uva_gbps": uva_gbps, "uva_call_ms": fixed, "uva_passes": points,
            "gpu_mem_gbps": nbytes / resident_ms[1] / 1e6, "matmul_tflops": 2 * big * dim * dim / resident_ms[big] / 1e9,
            "raw_uva_ms": dict(uva_ms, small=small_ms), "raw_gpu_ms": resident_ms}


def cpu_costs(device: torch.device) -> dict[str, float]:
    x = torch.zeros(16, device=device)
    n = 2000

    def launches() -> None:
        for _ in range(n):
            x.add_(1)

    host = torch.zeros(1024, dtype=torch.uint8).pin_memory()
    dst = torch.empty(1024, dtype=torch.uint8, device=device)

    def copies() -> None:
        for _ in range(n):
            dst.copy_(host, non_blocking=True)

    return {"launch_us": _wall_ms(launches, repeat=5) * 1e3 / n, "copy_call_us": _wall_ms(copies, repeat=5) * 1e3 / n}


def _forward_ms(model: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.inference_mode():
        return _wall_ms(lambda: model(ids, use_cache=False), repeat=21, warmup=3)


TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16)  # the tiny transformers models a block's fixed costs are measured on: their work is nothing
TINY_BLOCKS = (4, 20)  # the tiny models' depths: one more block costs the difference over the blocks between


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


# the tiny models with a real model's head width (128): whether attention then takes the kernels a real model's
# does (bench_predict_h200's CPU row measures both shapes beside the model's own block, 2026-12-02)
TINY_WIDE_HEADS = dict(TINY, hidden_size=512, intermediate_size=1024, head_dim=128)


def tiny_llama(layers: int, shape: dict | None = None) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **(shape or TINY)))


def tiny_moe(layers: int, top_k: int = 2, shape: dict | None = None) -> torch.nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=layers, num_experts=8, num_experts_per_tok=top_k,
                                              moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[],
                                              **(shape or TINY)))


def _by_depth(time_ms: Callable[[torch.nn.Module], float], make: Callable[[int], torch.nn.Module]) -> dict[int, float]:
    """``time_ms`` of the tiny model ``make`` builds, at each of ``TINY_BLOCKS`` depths."""
    return {n: time_ms(make(n)) for n in TINY_BLOCKS}


def _per_block_us(times: dict[int, float]) -> float:
    """Microseconds one more block adds, from ``_by_depth``'s times."""
    few, many = TINY_BLOCKS
    return (times[many] - times[few]) / (many - few) * 1e3


def model_cpu_costs(device: torch.device) -> dict[str, object]:
    """CPU time of one more eager decoder block (dense and MoE) and of one more routed expert per
    token, from tiny transformers models whose GPU work is negligible."""
    if not _has_transformers():
        return {}
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)

    def forward_ms(model: torch.nn.Module) -> float:
        return _forward_ms(model.to(device, torch.bfloat16).eval(), ids)

    dense, sparse = _by_depth(forward_ms, tiny_llama), _by_depth(forward_ms, tiny_moe)
    figures: dict[str, object] = {"block_cpu_us": _per_block_us(dense), "moe_block_cpu_us": _per_block_us(sparse)}
    # grouped expert kernels cost the same whatever the experts a batch touches; a per-expert loop
    # (transformers' eager experts) costs launches per expert and reads the routing back first
    implementation = getattr(tiny_moe(1).config, "_experts_implementation", None)
    looped = implementation in (None, "eager")
    figures["moe_sync"] = looped
    many = TINY_BLOCKS[1]  # the tiny MoE at top-6 against top-2: 4 more experts a token in each of its blocks
    figures["expert_cpu_us"] = max(0.0, (forward_ms(tiny_moe(many, 6)) - sparse[many]) / many / 4 * 1e3) \
        if looped else 0.0
    return figures


def block_cpu_us(blocks: Sequence[torch.nn.Module], forward: Callable[[], object], repeat: int = 5,
                 warmup: int = 2) -> float:
    """Host microseconds one of ``blocks`` takes in an eager ``forward()`` of the model that holds them: from
    its forward pre-hook to its forward hook, the median over blocks and runs (the garbage collector held off).
    ``block_cpu_us`` and ``moe_block_cpu_us`` measured on the model itself rather than on
    ``model_cpu_costs``'s tiny ones: on a forward the GPU keeps up with (a decode step of a resident model),
    a block's host time is the time the CPU takes to issue it."""
    times: list[float] = []
    started: dict[int, float] = {}

    def before(module, _args) -> None:
        started[id(module)] = time.perf_counter()

    def after(module, _args, _out) -> None:
        times.append((time.perf_counter() - started.pop(id(module))) * 1e6)

    hooks = [h for b in blocks for h in (b.register_forward_pre_hook(before), b.register_forward_hook(after))]
    try:
        for _ in range(warmup):
            forward()
        times.clear()
        gc.collect()
        gc.disable()
        try:
            for _ in range(repeat):
                forward()
        finally:
            gc.enable()
    finally:
        for h in hooks:
            h.remove()
    if not times:
        raise ValueError("block_cpu_us: no block ran in the forward")
    return statistics.median(times)


# the mean rows each of the 128 experts sees in ``moe_experts``' grouped calls: 16 to 32,768 tokens at top-8
EXPERT_ROWS = (1, 2, 8, 32, 128, 512, 2048)
# from these rows an expert on, the resident module's time is its flops' (below, its reads and fixed costs: the
# block floor and expert_gbps hold those): the points of ``expert_tflops_rows``
COMPUTE_ROWS = 128


def _uniform_routing(experts: int, top_k: int, tokens: int, g: torch.Generator) -> torch.Tensor:
    """Each of ``tokens`` tokens picks ``top_k`` distinct experts uniformly at random (the cost model's uniform
    routing): [tokens, top_k]."""
    return torch.rand(tokens, experts, generator=g).argsort(dim=1)[:, :top_k]


def moe_experts(device: torch.device, uva_gbps: float) -> dict[str, object]:
    """Routed-expert matmuls, grouped as a whole model runs them: a Qwen3-MoE experts module (128 experts, hidden
    2048, width 768, top-8) with its weights resident and read through UVA.
    - ``uva_expert_call_ms``: at 1 and 32 tokens (random routing), the time beyond the bytes it reads per grouped
      matmul (two a call);
    - ``uva_expert_passes``: with uniform random routing at ``EXPERT_ROWS`` rows an expert on average, the bytes read
      over the link / the experts' bytes (a grouped kernel re-reads an expert's weight per tile of that expert's
      rows: an expert with one row more than a tile is read twice, so equal rows of exactly a tile, 128 an expert,
      read 1.03 times and random routing at the same mean 1.41: bench/probe_expert_passes.py, 2026-12-02);
    - ``expert_tflops``: the resident module's flops / its time at the most rows; ``expert_tflops_rows``: the same
      at each of ``EXPERT_ROWS`` from ``COMPUTE_ROWS`` on (on the H200 122 TFLOP/s at 128 rows an expert, 182 at
      512, 199 at 2,048: a 2,048-token prefill's experts run at the first, not the last);
    - ``expert_gbps``: with its weights resident, the touched experts' bytes over the time they add between 1 and
      32 tokens (8 and about 115 experts touched): the grouped kernels' read rate (the call's fixed time and the
      routing's kernels lie in ``moe_block_gpu_us``, measured less the experts' reads at this rate)."""
    try:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    except ImportError:
        return {}
    experts_n, top_k, hidden, width = 128, 8, 2048, 768
    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=width, num_experts=experts_n,
                            num_experts_per_tok=top_k)
    # the experts kernel a whole model picks (grouped_mm where available), not a bare module's fallback
    config._experts_implementation = getattr(tiny_moe(1).config, "_experts_implementation", None)
    experts = Qwen3MoeExperts(config).to(device, torch.bfloat16).eval()
    params = dict(experts.named_parameters())
    total = sum(p.numel() * p.element_size() for p in params.values())
    hosts = {name: p.detach().cpu().pin_memory() for name, p in params.items()}
    resident_params = {name: p.data for name, p in params.items()}

    def timed(index: torch.Tensor, repeat: int) -> tuple[float, float]:
        tokens = index.shape[0]
        weights = torch.full((tokens, top_k), 1 / top_k, dtype=torch.bfloat16, device=device)
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)
        with torch.inference_mode():
            for name, p in params.items():
                p.data = resident_params[name]
            # queued: the GPU's time alone (issued as it runs, a 1-token call's 31 kernels are the CPU's time:
            # expert_gbps came out 3.9 TB/s so on the H200, 2.7 queued, 2026-12-02)
            resident = gpu_ms(lambda: experts(x, index, weights), queued=True)
            for name, p in params.items():
                p.data = device_view(hosts[name], device)
            uva = gpu_ms(lambda: experts(x, index, weights), repeat=repeat)
            for name, p in params.items():
                p.data = resident_params[name]
        return resident, uva

    estimates, resident_points = [], []
    for tokens in (1, 32):
        g = torch.Generator().manual_seed(tokens)
        index = torch.stack([torch.randperm(experts_n, generator=g)[:top_k] for _ in range(tokens)]).to(device)
        hit = len(set(index.flatten().tolist()))
        resident, uva = timed(index, 5)
        read_ms = total * hit / experts_n / uva_gbps / 1e6
        estimates.append(max(0.0, (uva - max(read_ms, resident)) / 2))
        resident_points.append((total * hit / experts_n, resident))
    fixed = statistics.median(estimates)
    (few_bytes, few_ms), (many_bytes, many_ms) = resident_points  # 8 experts touched, then about 115
    expert_gbps = (many_bytes - few_bytes) / max(many_ms - few_ms, 1e-6) / 1e6
    read_ms = total / uva_gbps / 1e6
    points, raw = [], []
    g = torch.Generator().manual_seed(7)
    for rows in EXPERT_ROWS:
        index = _uniform_routing(experts_n, top_k, rows * experts_n // top_k, g).to(device)
        resident, uva = timed(index, 3)
        points.append({"tokens": rows, "passes": round(max(1.0, (uva - 2 * fixed) / read_ms), 3)})
        raw.append({"rows_an_expert": rows, "tokens": index.shape[0], "resident_ms": resident, "uva_ms": uva})
    for a, b in zip(points, points[1:]):  # passes never fall as the rows grow (a dip is the timing's noise)
        b["passes"] = max(a["passes"], b["passes"])
    by_rows = tflops_by_rows(raw, top_k, total / experts_n)
    return {"uva_expert_call_ms": fixed, "uva_expert_passes": points, "expert_tflops": by_rows[-1]["tflops"],
            "expert_tflops_rows": by_rows, "expert_gbps": expert_gbps, "raw_experts": raw}


def tflops_by_rows(raw: list[dict], top_k: int, expert_bytes: float) -> list[dict]:
    """``expert_tflops_rows`` from ``moe_experts``' resident timings (bf16 experts of ``expert_bytes`` each, every
    routed row a multiply-add with each weight): the points from ``COMPUTE_ROWS`` rows an expert on, never falling
    as the rows grow (a dip is the timing's noise)."""
    points = [{"tokens": r["rows_an_expert"],
               "tflops": round(2.0 * r["tokens"] * top_k * expert_bytes / 2 / r["resident_ms"] / 1e9, 3)}
              for r in raw if r["rows_an_expert"] >= COMPUTE_ROWS]
    for a, b in zip(points, points[1:]):
        b["tflops"] = max(a["tflops"], b["tflops"])
    return points


def workspace(device: torch.device) -> dict[str, int]:
    """The GPU bytes library workspaces take on a stream a forward runs on: what stays allocated after a
    bf16 matmul and an SDPA attention on a fresh stream, less their outputs (cuBLAS keeps a workspace per
    stream it has run on, allocated through PyTorch's caching allocator, so ``max_memory_allocated`` sees it)."""
    torch.cuda.synchronize(device)
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        a = torch.randn(256, 4096, device=device, dtype=torch.bfloat16)
        w = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        q = torch.randn(1, 8, 256, 128, device=device, dtype=torch.bfloat16)
        stream.synchronize()
        before = torch.cuda.memory_allocated(device)
        y = a @ w.T
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        stream.synchronize()
        after = torch.cuda.memory_allocated(device)
    kept = after - before - y.untyped_storage().nbytes() - o.untyped_storage().nbytes()
    return {"workspace_bytes": max(0, kept)}


# a decoder block: hidden, intermediate, query heads, key/value heads, head dim (Llama-3-8B's)
LLAMA_8B_BLOCK = (4096, 14336, 32, 8, 128)


def captured(fn: Callable[[], object], warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` captured as a CUDA graph after ``warmup`` runs on a side stream: the graph, and what the captured
    call returned (the tensors each replay writes again)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def graph_ms(fn: Callable[[], object], repeat: int = 10) -> float:
    """Median milliseconds of a CUDA graph replay of ``fn`` (captured after two runs on a side stream)."""
    graph, _ = captured(fn)
    return gpu_ms(graph.replay, repeat=repeat, warmup=2)


# The MoE block ``moe_block_gpu_us`` is measured on: Qwen3-MoE's hidden size, heads and expert width, top-8 of 16
# experts (a token touches eight, as in the real model; the count of experts moves the floor by at most 6 us
# between 8 and 256, nor do 2 or 8 choices: bench/probe_replay_kernels.py --moe-decode, 2026-12-02). A tiny MoE's
# block (hidden 64) gave 150 us where the Qwen3-MoE shape's block takes 217 beyond its roofline: its kernels work
# on real activations, and its grouped expert matmul reads 8 experts at 1.6 TB/s, not at a GEMV's rate.
MOE_FLOOR_SHAPE = dict(vocab_size=256, hidden_size=2048, intermediate_size=6144, num_attention_heads=32,
                       num_key_value_heads=4, head_dim=128, num_experts=16, num_experts_per_tok=8,
                       moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[])
MOE_FLOOR_BLOCKS = (4, 12)  # its depths (12 blocks: 2.3 GB in bf16)


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
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # made in its dtype where it runs (on the host, 12 full-width blocks are slow)
        try:
            with torch.device(device):
                model = Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=layers, **shape))
        finally:
            torch.set_default_dtype(old)
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


def block_compute(device: torch.device, matmul_tflops: float, gpu_mem_gbps: float,
                  shape: tuple[int, int, int, int, int] = LLAMA_8B_BLOCK, tokens: int = 2048,
                  timer: Callable[[Callable[[], object]], float] | None = None) -> dict[str, float]:
    """What a decoder block computes beyond its matmuls: ``attention_tflops`` and ``elementwise_bytes``, timed
    queued (``gpu_ms(queued=True)``: the GPU's time alone; a block issued as it runs is CPU-bound in part and
    gave 25.9-34.7 bytes where queued gave 17.0 on the H200, 2026-12-02, bench/probe_uva_experts.py)."""
    timer = timer or (lambda fn: gpu_ms(fn, queued=True))
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    except ImportError:
        return {}
    hidden, inter, heads, kv_heads, head_dim = shape
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=head_dim, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    layer = LlamaDecoderLayer(config, layer_idx=0).to(device, dtype).eval()
    rotary = LlamaRotaryEmbedding(config).to(device)
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
    matrices = [(heads * head_dim, hidden), (kv_heads * head_dim, hidden), (kv_heads * head_dim, hidden),
                (hidden, heads * head_dim), (inter, hidden), (inter, hidden), (hidden, inter)]
    # the roofline of planner/cost/layer.py for a resident matrix: flops at the matmul rate or bytes at memory's
    matmul = sum(max(2.0 * tokens * r * c / (matmul_tflops * 1e9), r * c * itemsize / gpu_mem_gbps / 1e6)
                 for r, c in matrices)
    rest = max(0.0, block - matmul - attention)
    outputs = sum(r for r, _ in matrices)
    return {"attention_tflops": flops / attention / 1e9,
            "elementwise_bytes": rest * gpu_mem_gbps * 1e6 / (tokens * outputs)}


# how long calibrate keeps an idle GPU and its link busy before it times anything
WARM_UP_S = 3.0


def warm_up(device: torch.device, seconds: float = WARM_UP_S) -> None:
    """Matmuls and pinned copies for ``seconds``, so that an idle GPU's clocks and its host link's power state have
    left their idle levels before the first timing. On a freshly started H200 (SM clock 345 MHz at rest) calibrate
    measured the link at 46.7 and 46.5 GB/s and GPU memory at 1,967 and 2,226 GB/s in two runs (2026-12-02,
    bench/results/predict-h200-2026-12-02m and -n) where a run right after other work on the same machine kind
    measured 55.2 and 2,820, and the first run's copy-bound plans then ran at 55."""
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    host = torch.empty(64 * 2**20, dtype=torch.uint8).pin_memory()
    on_gpu = torch.empty_like(host, device=device)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        on_gpu.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
    del a, host, on_gpu


# the most the link's rate may differ between calibrate's first and last measurement of it for a steady machine
STEADY_SHARE = 0.05


def steadiness(first_gbps: float, last_gbps: float) -> dict[str, object]:
    """The link measured at calibrate's start and again at its end; ``unsteady``: a sentence to show the user when
    they differ by more than ``STEADY_SHARE`` (something else used the machine, or it left an idle state during
    the run: its figures are not to be trusted), else None."""
    change = last_gbps / first_gbps - 1.0
    unsteady = None
    if abs(change) > STEADY_SHARE:
        unsteady = (f"the host link measured {first_gbps:.1f} GB/s at calibrate's start and {last_gbps:.1f} at its "
                    f"end ({change:+.0%}): the machine was not steady while it was measured; run calibrate again "
                    "when nothing else uses the GPU or the host")
    return {"h2d_gbps_first": round(first_gbps, 3), "h2d_gbps_last": round(last_gbps, 3), "unsteady": unsteady}


def calibrate(device: str | torch.device = "cuda", name: str | None = None) -> tuple[HardwareProfile, dict]:
    """Measure the local GPU; returns the profile and the raw timings."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError("calibrate measures a CUDA GPU, and none is available here")
    warm_up(device)
    figures: dict[str, object] = {}
    figures.update(link(device))
    figures.update(shared_link(device))
    figures.update(matmuls(device))
    figures.update(cpu_costs(device))
    figures.update(model_cpu_costs(device))
    figures.update(moe_experts(device, float(figures["uva_gbps"])))
    figures.update(host_experts(device))
    figures.update(block_compute(device, float(figures["matmul_tflops"]), float(figures["gpu_mem_gbps"])))
    figures.update(block_gpu_floor(device, gpu_mem_gbps=float(figures["gpu_mem_gbps"]),
                                   expert_gbps=figures.get("expert_gbps")))
    figures.update(kv_read(device))
    figures.update(workspace(device))
    raw = {k: figures.pop(k) for k in ("raw_uva_ms", "raw_gpu_ms", "raw_link", "raw_experts") if k in figures}
    raw["steady"] = steadiness(float(figures["h2d_gbps"]), link(device)["h2d_gbps"])
    gpu = torch.cuda.get_device_name(device)
    day = datetime.date.today().isoformat()
    figures.setdefault("block_cpu_us", 30 * float(figures["launch_us"]))  # no transformers: ~30 kernels
    figures.setdefault("moe_block_cpu_us", 60 * float(figures["launch_us"]))
    figures.setdefault("expert_cpu_us", 0.0)
    profile = HardwareProfile(
        name=name or gpu.replace("NVIDIA ", "").lower().replace(" ", "-"),
        source=f"planner calibrate on {gpu}, torch {torch.__version__}, {day}",
        **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in figures.items()})
    return profile, raw
