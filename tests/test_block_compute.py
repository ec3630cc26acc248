"""What the roofline of a block's matrices misses (planner/cost/block.py): attention's own arithmetic over the
context and the elementwise work between the matmuls, against figures computed by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

import planner
from conftest import EXAMPLES
from planner.cost.block import ONE, Sequences, block_ms, block_shape, sequences_of
from schemas.io import load_spec
from schemas.hardware_profile import H200_ATTENTION_TFLOPS, H200_ELEMENTWISE_BYTES
from schemas.hardware import HardwareProfile, load_hardware
from schemas.plan_content import PlanParam
from schemas.workload import Workload, WorkloadItem

LLAMA_BLOCK = {"self_attn.q_proj.weight": [4096, 4096], "self_attn.k_proj.weight": [1024, 4096],
               "self_attn.v_proj.weight": [1024, 4096], "self_attn.o_proj.weight": [4096, 4096],
               "mlp.gate_proj.weight": [14336, 4096], "mlp.up_proj.weight": [14336, 4096],
               "mlp.down_proj.weight": [4096, 14336], "input_layernorm.weight": [4096],
               "post_attention_layernorm.weight": [4096]}


def triples(params: dict[str, list[int]], role_of=lambda rel, shape: "matmul" if len(shape) >= 2 else "vector"):
    return [(rel, PlanParam(shape=s, dtype="bfloat16", bytes=2 * math.prod(s)), role_of(rel, s))
            for rel, s in params.items()]


def test_a_llama_block_attends_with_its_query_width_and_caches_k_and_v():
    shape = block_shape(triples(LLAMA_BLOCK), None)
    assert shape.query == 4096 and shape.kv_bytes == (1024 + 1024) * 2
    assert shape.outputs == 4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096


def test_prefill_attention_is_causal_arithmetic_and_elementwise_is_per_token():
    hw = load_hardware("h200")
    shape = block_shape(triples(LLAMA_BLOCK), None)
    tokens = 2048
    pairs = tokens * (tokens + 1) / 2
    attention = 4 * pairs * 4096 / (hw.attention_tflops * 1e9)
    elementwise = tokens * 43008 * hw.elementwise_bytes / hw.gpu_mem_gbps / 1e6
    assert block_ms(shape, tokens, ONE, hw) == pytest.approx(attention + elementwise)


def test_a_decode_over_a_long_context_reads_the_kv_cache():
    hw = load_hardware("h200")
    shape = block_shape(triples(LLAMA_BLOCK), None)
    seqs = Sequences(count=32, context=4096)
    # grouped-query attention over cached tokens (transformers' static cache): repeat_kv reads the 32 sequences'
    # K and V (bf16, 4 KiB a token) and writes them for the 32 query heads (16 KiB a token), a strided copy;
    # SDPA then reads the 16 KiB a token at attention's cache-read rate
    held = 32 * (4096 + 1)
    repeat = held * (4096 + 2 * 4096 * 2) / hw.strided_copy_gbps / 1e6
    read = held * 2 * 4096 * 2 / hw.kv_read_gbps / 1e6
    flops = 4 * held * 4096 / (hw.attention_tflops * 1e9)
    assert read > flops  # memory-bound
    elementwise = 32 * 43008 * hw.elementwise_bytes / hw.gpu_mem_gbps / 1e6
    assert block_ms(shape, 32, seqs, hw) == pytest.approx(repeat + read + elementwise)
    # a model whose KV heads are its query heads has nothing to repeat: SDPA reads the cache itself
    full = block_shape(triples({**LLAMA_BLOCK, "self_attn.k_proj.weight": [4096, 4096],
                                "self_attn.v_proj.weight": [4096, 4096]}), None)
    assert full.repeated_bytes == 0
    assert block_ms(full, 32, seqs, hw) == pytest.approx(
        held * 2 * 4096 * 2 / hw.kv_read_gbps / 1e6 + 32 * (43008 + 6144) * hw.elementwise_bytes / hw.gpu_mem_gbps / 1e6)
    assert block_ms(shape, 32, seqs, hw) > 20 * block_ms(shape, 32, ONE, hw)  # the context dominates


def test_a_captured_prefill_attends_the_whole_square_over_repeated_keys():
    """In CUDA graph replay transformers passes SDPA a mask (it cannot read the padding mask while capturing):
    every query-key pair, keys and values repeated for the query heads (measured: bench/probe_replay_kernels.py)."""
    hw = load_hardware("h200")
    shape = block_shape(triples(LLAMA_BLOCK), None)
    tokens = 2048
    eager = block_ms(shape, tokens, ONE, hw)
    captured = Sequences(captured=True)
    square = 4 * tokens * tokens * 4096 / (hw.attention_tflops * 1e9)
    repeat = tokens * (4096 + 2 * 4096 * 2) / hw.strided_copy_gbps / 1e6
    elementwise = tokens * 43008 * hw.elementwise_bytes / hw.gpu_mem_gbps / 1e6
    assert block_ms(shape, tokens, captured, hw) == pytest.approx(repeat + square + elementwise)
    assert block_ms(shape, tokens, captured, hw) > eager
    # a decode step (one token a sequence) attends the same pairs either way
    assert block_ms(shape, 1, captured, hw) == block_ms(shape, 1, ONE, hw)
    assert sequences_of(WorkloadItem(tokens=2048, mode="graph")) == captured
    assert sequences_of(WorkloadItem(tokens=2048)) == ONE


def test_fused_projections_and_routed_experts():
    fused = triples({"attn.qkv_proj.weight": [3072, 1024], "attn.o_proj.weight": [1024, 1024],
                     "mlp.fc1.weight": [4096, 1024], "mlp.fc2.weight": [1024, 4096]})
    shape = block_shape(fused, None)
    assert shape.query == 1024 and shape.kv_bytes == 2048 * 2  # a third each
    routed = triples({"mlp.experts.gate_up_proj": [8, 256, 64], "mlp.experts.down_proj": [8, 64, 128]},
                     role_of=lambda rel, s: "routed")
    assert block_shape(routed, (8, 2)).outputs == 2 * (256 + 64)  # the top-2 experts a token uses
    per_expert = triples({f"mlp.experts.{e}.w1.weight": [128, 64] for e in range(8)}, role_of=lambda rel, s: "routed")
    assert block_shape(per_expert, (8, 2)).outputs == pytest.approx(2 * 128)
    assert block_shape(triples({"mlp.up.weight": [8, 8]}), None).query == 0  # no attention found: none costed


def test_sequences_come_from_the_workload_item_where_it_has_them():
    assert sequences_of(WorkloadItem(tokens=2048)) == ONE
    # a context is what each sequence's cache holds after the forward (schemas/workload.py): 4,095 before it
    assert sequences_of(WorkloadItem(batch=32, context=4096)) == Sequences(32, 4095)
    assert sequences_of(WorkloadItem(tokens=2048, context=4096), "prefill") == Sequences(1, 2048)
    assert sequences_of(SimpleNamespace(rows=8, batch=64, context=None)) == Sequences(8, 0)  # a row each at most


def test_a_profile_without_the_figures_takes_the_h200_ones():
    data = load_hardware("h200").model_dump(exclude={"attention_tflops", "elementwise_bytes"})
    old = HardwareProfile.model_validate(data)
    assert old.attention_tflops == H200_ATTENTION_TFLOPS and old.elementwise_bytes == H200_ELEMENTWISE_BYTES


def test_compute_bound_prefill_is_within_ten_percent_of_the_h200():
    # issue 19: the Llama-3-8B shape at a 2,048-token prefill, measured on the H200: 62 ms resident (62.7 and
    # 63.3 in two runs), 67 ms with 4 layers offloaded; predicted 41.3 and 46 ms before the block's extra work
    spec = load_spec(EXAMPLES / "generated" / "llama-3-8b.yaml")
    prefill = Workload({"prefill": WorkloadItem(tokens=2048)})
    resident = planner.plan(spec, backend="none", workload=prefill).predictions.weighted_step_ms
    four = planner.plan(spec, strategy="group", group_size=8, num_in_group=1, backend="prefetch", workload=prefill)
    assert sum(1 for layer in four.layers if layer.offloaded) == 4
    assert resident == pytest.approx(62.7, rel=0.1)
    assert four.predictions.weighted_step_ms == pytest.approx(67.0, rel=0.1)


def test_calibrate_measures_both_figures_on_a_tiny_block():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import time

    from runtime.calibrate import block_compute

    def wall(fn):
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    figures = block_compute(torch.device("cpu"), 1e-3, 1.0, shape=(64, 160, 4, 2, 16), tokens=16, timer=wall)
    assert set(figures) == {"attention_tflops", "elementwise_bytes"}
    assert figures["attention_tflops"] > 0 and figures["elementwise_bytes"] >= 0


def test_block_cpu_us_times_each_block_from_its_pre_hook_to_its_hook(monkeypatch):
    torch = pytest.importorskip("torch")
    import itertools

    import runtime.calibrate as calibrate

    blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    head = torch.nn.Linear(4, 4)
    x = torch.zeros(1, 4)
    calls = []

    def forward():
        calls.append(1)
        y = x
        for block in blocks:
            y = block(y)
        return head(y)

    ticks = itertools.count()
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: next(ticks) * 1e-3)  # a clock of 1 ms a read
    assert calibrate.block_cpu_us(blocks, forward, repeat=4, warmup=1) == pytest.approx(1000.0)  # 1 read apart
    assert len(calls) == 5  # the warm-up, then the timed forwards
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in blocks)  # its hooks are gone
    with pytest.raises(ValueError, match="no block ran"):
        calibrate.block_cpu_us([head.__class__(4, 4)], forward, repeat=1, warmup=0)
    assert not head._forward_hooks


def test_a_queued_timing_holds_the_stream_until_the_cpu_has_issued_the_call(monkeypatch):
    """``gpu_ms(queued=True)``: each timed call's start event is recorded behind a GPU sleep, so the CPU issues the
    whole call before its first kernel runs (the block's figures are the GPU's time alone, not its issue time)."""
    import torch

    from runtime import calibrate

    log: list[str] = []

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self, stream=None):
            log.append("record")

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 2.5

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(f"sleep {cycles}"))
    assert calibrate.gpu_ms(lambda: log.append("call"), repeat=2, warmup=1, queued=True) == 2.5
    sleep = f"sleep {calibrate.QUEUE_CYCLES}"
    assert log == ["call", sleep, "record", "call", "record", sleep, "record", "call", "record"]
    log.clear()
    calibrate.gpu_ms(lambda: log.append("call"), repeat=1, warmup=0)
    assert log == ["record", "call", "record"]  # as issued: no sleep


def test_the_block_gpu_floor_is_paid_per_block_in_eager_and_graph_alike():
    """block_gpu_us / moe_block_gpu_us add a fixed GPU time to every decoder block (dense or MoE), not to other
    layers, in both modes: a resident decode replayed as a graph is the weights' reads plus the floors."""
    from planner.cost.layer import layer_work, profile_for
    from schemas.plan_content import PlanLayer
    from schemas.spec_layers import MoeSpec

    hw = load_hardware("h200").model_copy(update={"block_gpu_us": 0.0, "moe_block_gpu_us": 0.0})
    floored = hw.model_copy(update={"block_gpu_us": 57.0, "moe_block_gpu_us": 217.0})

    def layer(params: dict, moe=None, name="model.layers.0") -> PlanLayer:
        ps = {k: PlanParam(shape=v, dtype="bfloat16", bytes=2 * math.prod(v)) for k, v in params.items()}
        return PlanLayer(name=name, params=ps, resident_bytes=sum(p.bytes for p in ps.values()), offloaded_bytes=0,
                         moe=moe)

    attention = {f"self_attn.{n}.weight": [256, 256] for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    dense = layer(attention)
    sparse = layer({"mlp.gate.weight": [8, 256], "mlp.experts.gate_up_proj": [8, 512, 256],
                    "mlp.experts.down_proj": [8, 256, 256], **attention}, MoeSpec(experts=8, top_k=2))
    norm = layer({"weight": [256]}, name="model.norm")
    for mode in ("eager", "graph"):
        before, after = profile_for(hw, mode), profile_for(floored, mode)
        assert layer_work(dense, 1, after).gpu_ms - layer_work(dense, 1, before).gpu_ms == pytest.approx(0.057)
        assert layer_work(sparse, 1, after).gpu_ms - layer_work(sparse, 1, before).gpu_ms == pytest.approx(0.217)
        assert layer_work(norm, 1, after).gpu_ms == layer_work(norm, 1, before).gpu_ms


def test_calibrate_measures_the_block_gpu_floor_beyond_the_blocks_reads():
    """Per block: the step's time by depth, less (MoE) the weights a token reads in the block at gpu_mem_gbps."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from runtime.calibrate import MOE_FLOOR_SHAPE, block_gpu_floor, moe_block_bytes

    def steps(fn):  # a timer that counts the decoder blocks run: 0.05 ms each, 0.3 ms for the rest of the step
        blocks = []
        hooks = [m.register_forward_hook(lambda *_: blocks.append(1)) for m in _models
                 for m in m.modules() if type(m).__name__.endswith("DecoderLayer")]
        fn()
        for h in hooks:
            h.remove()
        return 0.3 + 0.05 * len(blocks)

    _models: list = []
    real = torch.nn.Module.to

    def keep(self, *args, **kwargs):  # the models the floor is measured on
        if type(self).__name__.endswith("ForCausalLM"):
            _models.append(self)
        return real(self, *args, **kwargs)

    small = dict(MOE_FLOOR_SHAPE, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, moe_intermediate_size=32)
    # attention 64 x 16 x (8 + 4) and router 16 x 64; 8 experts x 3 x 64 x 32; float32 on the CPU
    dense, experts = moe_block_bytes(small, 4)
    assert (dense, experts) == ((64 * 16 * 12 + 16 * 64) * 4, 8 * 3 * 64 * 32 * 4)
    torch.nn.Module.to = keep
    try:
        figures = block_gpu_floor(torch.device("cpu"), timer=steps, moe_shape=small)
        read = block_gpu_floor(torch.device("cpu"), timer=steps, moe_shape=small, gpu_mem_gbps=10.0)
        grouped = block_gpu_floor(torch.device("cpu"), timer=steps, moe_shape=small, gpu_mem_gbps=10.0,
                                  expert_gbps=40.0)
    finally:
        torch.nn.Module.to = real
    assert figures == {"block_gpu_us": pytest.approx(50.0), "moe_block_gpu_us": pytest.approx(50.0)}
    # the MoE block's reads at 10 GB/s: its bytes / 1e4 us; the dense floor is a tiny model's, nothing subtracted
    assert read == {"block_gpu_us": pytest.approx(50.0),
                    "moe_block_gpu_us": pytest.approx(50.0 - (dense + experts) / 1e4)}
    # the experts at their own rate where calibrate measured one (the cost model reads them so)
    assert grouped["moe_block_gpu_us"] == pytest.approx(50.0 - dense / 1e4 - experts / 4e4)

    def short_of_memory(fn):  # the MoE of real width does not fit: the tiny MoE's floor instead
        if _models and getattr(_models[-1].config, "num_experts", None) == small["num_experts"]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return steps(fn)

    torch.nn.Module.to = keep
    try:
        fallback = block_gpu_floor(torch.device("cpu"), timer=short_of_memory, moe_shape=small, gpu_mem_gbps=10.0)
    finally:
        torch.nn.Module.to = real
    assert fallback == {"block_gpu_us": pytest.approx(50.0), "moe_block_gpu_us": pytest.approx(50.0)}


def test_a_decode_reads_its_kv_cache_at_the_kv_rate_where_the_profile_has_one():
    """kv_read_gbps (attention's read of the cache) replaces gpu_mem_gbps for the cache's bytes, and only there;
    calibrate's kv_read gives the cache's bytes over the time."""
    hw = load_hardware("h200").model_copy(update={"kv_read_gbps": None, "attention_tflops": 1e6,
                                                  "elementwise_bytes": 0.0})
    shape = block_shape([("self_attn.q_proj.weight", PlanParam(shape=[4096, 4096], dtype="bfloat16",
                                                               bytes=2 * 4096 * 4096), "matmul"),
                         ("self_attn.k_proj.weight", PlanParam(shape=[4096, 4096], dtype="bfloat16",
                                                               bytes=2 * 4096 * 4096), "matmul"),
                         ("self_attn.v_proj.weight", PlanParam(shape=[4096, 4096], dtype="bfloat16",
                                                               bytes=2 * 4096 * 4096), "matmul")], None)
    seqs = Sequences(8, 4095)
    slow = block_ms(shape, 8, seqs, hw)
    fast = block_ms(shape, 8, seqs, hw.model_copy(update={"kv_read_gbps": 2 * hw.gpu_mem_gbps}))
    assert slow == pytest.approx(8 * 4096 * shape.kv_bytes / hw.gpu_mem_gbps / 1e6)
    assert fast == pytest.approx(slow / 2)


def test_calibrate_times_the_kv_read_as_bytes_over_time():
    torch = pytest.importorskip("torch")
    from runtime.calibrate import kv_read

    figures = kv_read(torch.device("cpu"), batch=2, heads=4, kv_heads=2, head_dim=8, context=16, timer=lambda fn: 0.5)
    assert figures == {"kv_read_gbps": pytest.approx(2 * 2 * 2 * 16 * 8 * 4 / 0.5 / 1e6)}



def test_resident_routed_experts_are_read_at_the_grouped_rate_where_the_profile_has_one():
    """expert_gbps prices a grouped expert matmul's read of resident experts (whole layers and a split layer's GPU
    part); dense matmuls and UVA experts keep their rates; absent, gpu_mem_gbps."""
    from planner.cost.host_experts import ExpertShape, gpu_part_ms
    from planner.cost.layer import param_time

    hw = load_hardware("h200").model_copy(update={"expert_gbps": None, "uva_expert_call_ms": 0.0})
    fast = hw.model_copy(update={"expert_gbps": 2 * hw.gpu_mem_gbps})
    experts = PlanParam(shape=[128, 1536, 2048], dtype="bfloat16", bytes=2 * 128 * 1536 * 2048)
    dense = PlanParam(shape=[4096, 2048], dtype="bfloat16", bytes=2 * 4096 * 2048)
    moe = (128, 8)
    name, rel = "model.layers.0", "mlp.experts.gate_up_proj"
    plain, grouped = (param_time(name, rel, experts, 1, h, moe) for h in (hw, fast))
    assert plain.gpu_ms == pytest.approx(experts.bytes * 8 / 128 / hw.gpu_mem_gbps / 1e6)
    assert grouped.gpu_ms == pytest.approx(plain.gpu_ms / 2)
    assert grouped.uva_ms == plain.uva_ms  # through UVA: the link's rate
    q = param_time(name, "self_attn.q_proj.weight", dense, 1, hw, None)
    assert param_time(name, "self_attn.q_proj.weight", dense, 1, fast, None).gpu_ms == q.gpu_ms
    shape = ExpertShape(nbytes=experts.bytes // 128, numel=1536 * 2048, width=2048, itemsize=2, top_k=8, experts=128)
    q8 = [8 / 128] * 128
    assert gpu_part_ms(q8, 1, shape, fast, uva=False) == pytest.approx(gpu_part_ms(q8, 1, shape, hw, uva=False) / 2)
