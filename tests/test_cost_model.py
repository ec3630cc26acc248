"""The cost model against timelines computed by hand (round-number hardware, tiny layers)."""

from __future__ import annotations

import math

import pytest

from planner.cost.expert_reads import TILE_ROWS, measured_reads, taller_tiles, tiles, touched_experts, uniform_reads
from planner.cost.layer import LayerWork, layer_times, layer_work, layers_work, touched_by
from planner.cost.timeline import Copy, simulate
from schemas.hardware import load_hardware
from schemas.hardware_profile import HardwareProfile, UvaPoint
from schemas.plan_content import PlanLayer, PlanParam
from schemas.spec_layers import MoeSpec

# 1 GB/s copies (1 MB = 1 ms), 0.5 GB/s UVA, 1000 GB/s GPU memory, 1 TFLOP/s; no elementwise work (the
# block's work besides its matrices is tested in test_block_compute.py)
HW = HardwareProfile(
    name="toy", source="test", h2d_gbps=1.0, uva_gbps=0.5, gpu_mem_gbps=1000.0, matmul_tflops=1.0,
    uva_passes=[UvaPoint(tokens=1, passes=1.0), UvaPoint(tokens=16, passes=1.0), UvaPoint(tokens=256, passes=2.0),
                UvaPoint(tokens=4096, passes=16.0)],
    launch_us=1.0, block_cpu_us=100.0, moe_block_cpu_us=50.0, expert_cpu_us=10.0, copy_call_us=0.0, moe_sync=True,
    elementwise_bytes=0.0)


def w(gpu: float, copy: float = 0.0, cpu: float = 0.0) -> LayerWork:
    return LayerWork(gpu_ms=gpu, cpu_ms=cpu, copy_ms=copy, copy_bytes=int(copy * 1e6))


def test_no_offload_is_the_sum_of_layers():
    t = simulate([w(1), w(2), w(3)], [])
    assert t.step_ms == 6 and t.stall_ms == 0 and [lt.start for lt in t.layers] == [0, 1, 3]


def test_one_offloaded_layer_copy_overlaps_the_layers_before_it():
    # layer 2 (copy 5 ms) is copied from the start of the forward (trigger 0); layers 0, 1 take 3 ms
    t = simulate([w(1), w(2), w(1, copy=5)], [Copy(layer=2, trigger=0, previous_forward=False)])
    assert t.layers[2].copy_start == 0 and t.layers[2].copy_end == 5
    assert t.layers[2].stall == pytest.approx(2) and t.layers[2].start == 5
    assert t.step_ms == 6 and t.bound == "copy"


def test_all_offloaded_one_slot_serialises_copy_and_compute():
    # one slot: layer j's copy can only start before layer j runs (its slot is free after j-1)
    work = [w(1, copy=2)] * 3
    copies = [Copy(0, 0, True), Copy(1, 1, False), Copy(2, 2, False)]
    t = simulate(work, copies)
    # layer 0 primed; before it runs, its copy for the next forward: [0,2] on the link.
    # layer 0 computes [0,1]; layer 1's copy waits for the link: [2,4]; layer 1 runs [4,5];
    # layer 2 copy [5,7], runs [7,8]. Join: the link is free at 7, compute at 8.
    assert [lt.start for lt in t.layers] == [0, 4, 7]
    assert t.step_ms == 8 and t.stall_ms == pytest.approx(3 + 2)


def test_all_offloaded_two_slots_keeps_the_link_busy():
    # two slots, step 1: the copy of layer j is issued before layer j-1 runs
    work = [w(1, copy=2)] * 4
    copies = [Copy(0, 3, True), Copy(1, 0, False), Copy(2, 1, False), Copy(3, 2, False)]
    t = simulate(work, copies)
    # link: copy1 [0,2], copy2 [2,4], copy3 [4,6], copy0 (for the next forward) [6,8]
    # compute: L0 [0,1], L1 waits for 2 -> [2,3], L2 waits 4 -> [4,5], L3 waits 6 -> [6,7]; join at 8
    assert [lt.start for lt in t.layers] == [0, 2, 4, 6]
    assert t.step_ms == 8 and t.copy_ms == 8


def test_wrap_around_with_n_not_a_multiple_of_the_slots():
    # 3 offloaded layers, 2 slots (the planner's schedule for step 1): compute from the schedule itself
    from schemas.schedule import schedule

    triggers = schedule([0, 1, 2], 3, 1)
    copies = [Copy(j, t.copy_before(3), t.previous_forward) for j, t in enumerate(triggers)]
    t = simulate([w(1, copy=2)] * 3, copies)
    # the link carries every layer's copy once per forward: at least 6 ms
    assert t.copy_ms == 6 and t.step_ms >= 6
    # every copy issued in this forward for this forward ends before its layer starts
    for j, c in enumerate(copies):
        if not c.previous_forward:
            assert t.layers[j].copy_end <= t.layers[j].start
    # and the whole forward is no longer than doing everything one after another
    assert t.step_ms <= 3 * (1 + 2)


def test_cpu_bound_forward():
    t = simulate([w(0.1, cpu=1)] * 5, [])
    assert t.step_ms == pytest.approx(5) and t.bound == "cpu"


def _layer(params: dict[str, list[int]], offloaded=(), moe=None, name="model.layers.0", uva=False) -> PlanLayer:
    """``uva``: the offloaded params are read through UVA (else they are prefetched)."""
    ps = {k: PlanParam(shape=v, dtype="bfloat16", bytes=2 * math.prod(v)) for k, v in params.items()}
    off = sum(ps[k].bytes for k in offloaded)
    return PlanLayer(name=name, params=ps, offloaded=list(offloaded), uva=list(offloaded) if uva else [],
                     resident_bytes=sum(p.bytes for p in ps.values()) - off, offloaded_bytes=off, moe=moe)


def test_uva_matmul_at_1_and_4096_tokens():
    layer = _layer({"mlp.up_proj.weight": [1000, 1000]}, offloaded=["mlp.up_proj.weight"])  # 2 MB
    layer = layer.model_copy(update={"uva": list(layer.offloaded)})
    one = layer_work(layer, 1, HW)
    assert one.gpu_ms == pytest.approx(2e6 / 0.5e9 * 1e3)  # 4 ms: read once over the link
    big = layer_work(layer, 4096, HW)
    flops_ms = 2 * 4096 * 1e6 / 1e12 * 1e3  # 8.192 ms
    assert big.gpu_ms == pytest.approx(max(flops_ms, 4.0 * 16))  # read 16 times
    resident = layer_work(_layer({"mlp.up_proj.weight": [1000, 1000]}), 4096, HW)
    assert resident.gpu_ms == pytest.approx(max(flops_ms, 2e6 / 1000e9 * 1e3))


def test_a_uva_matmul_pays_the_fixed_call_time_off_the_link():
    hw = HW.model_copy(update={"uva_call_ms": 0.25, "uva_expert_call_ms": 0.5})
    layer = _layer({"mlp.up_proj.weight": [1000, 1000], "norm.weight": [1000]}, offloaded=["mlp.up_proj.weight"])
    on_uva = layer.model_copy(update={"uva": list(layer.offloaded)})
    plain, paid = layer_work(on_uva, 1, HW), layer_work(on_uva, 1, hw)
    assert paid.gpu_ms == pytest.approx(plain.gpu_ms + 0.25)  # one matrix read through UVA: one fixed time
    assert paid.uva_link_ms == pytest.approx(plain.uva_link_ms) == pytest.approx(4.0)  # the link moves bytes only
    assert layer_work(layer, 1, hw).gpu_ms == pytest.approx(layer_work(layer, 1, HW).gpu_ms)  # prefetched: none
    experts = _layer({"mlp.experts.gate_up_proj": [8, 100, 100]}, offloaded=["mlp.experts.gate_up_proj"],
                     moe=MoeSpec(experts=8, top_k=2))
    grouped = experts.model_copy(update={"uva": list(experts.offloaded)})
    assert layer_work(grouped, 1, hw).gpu_ms == pytest.approx(layer_work(grouped, 1, HW).gpu_ms + 0.5)


def test_the_uva_line_through_two_reads_gives_the_rate_and_the_fixed_time():
    from runtime.calibrate import uva_line

    # 0.1 ms + bytes at 50 GB/s: 134 MB in 2.784 ms, 8 MB in 0.2678 ms
    big, small = 134_217_728, 8_388_608
    gbps, fixed = uva_line(big, 0.1 + big / 50e6, small, 0.1 + small / 50e6)
    assert gbps == pytest.approx(50.0) and fixed == pytest.approx(0.1)
    # a small read no slower per byte than the big one: no fixed time, the big read's rate
    assert uva_line(big, big / 50e6, small, small / 55e6) == (pytest.approx(50.0), 0.0)
    assert uva_line(big, 1.0, small, 2.0) == (pytest.approx(big / 1e6), 0.0)


def test_prefetch_layer_copies_every_offloaded_byte():
    layer = _layer({"mlp.up_proj.weight": [1000, 1000], "norm.weight": [1000]}, offloaded=["mlp.up_proj.weight"])
    work = layer_work(layer, 1, HW)
    assert work.copy_bytes == 2_000_000 and work.copy_ms == pytest.approx(2.0)


def test_embedding_lookup_reads_only_the_token_rows():
    emb = _layer({"weight": [10000, 100]}, offloaded=["weight"], name="model.embed_tokens", uva=True)
    t1 = layer_work(emb, 1, HW).gpu_ms
    assert t1 == pytest.approx(200 / 0.5e9 * 1e3)  # one 200-byte row
    head = _layer({"weight": [10000, 100]}, offloaded=["weight"], name="lm_head", uva=True)
    assert layer_work(head, 1, HW).gpu_ms == pytest.approx(2e6 / 0.5e9 * 1e3)  # the head reads it all


@pytest.mark.parametrize("tokens", [1, 512])
def test_moe_uva_reads_the_touched_experts(tokens):
    experts, top_k = 64, 4
    layer = _layer({"mlp.experts.gate_up_proj": [experts, 100, 100]}, offloaded=["mlp.experts.gate_up_proj"],
                   moe=MoeSpec(experts=experts, top_k=top_k))
    hit = touched_experts(experts, top_k, tokens)
    nbytes = 2 * experts * 100 * 100 * hit / experts
    rows = tokens * top_k / hit
    flops_ms = 2 * tokens * top_k * 100 * 100 / 1e12 * 1e3
    expect = max(flops_ms, nbytes * HW.passes(rows) / 0.5e9 * 1e3)
    work = layer_work(layer.model_copy(update={"uva": list(layer.offloaded)}), tokens, HW)
    assert work.gpu_ms == pytest.approx(expect)
    assert work.cpu_ms == pytest.approx((HW.moe_block_cpu_us + HW.expert_cpu_us * hit) / 1e3)
    if tokens == 1:
        assert hit == pytest.approx(top_k)  # one token: exactly its top-k experts
    else:
        assert hit == pytest.approx(experts, rel=1e-6)  # 512 tokens touch every expert
    prefetched = layer_work(layer, tokens, HW)
    assert prefetched.copy_bytes == 2 * experts * 100 * 100  # a copy moves every expert


@pytest.mark.parametrize("tokens", [1, 32, 2048])
def test_moe_uva_reads_the_experts_measured_routing_touches(tokens):
    """With measured routing a whole (unsplit) experts layer reads only the experts the routing reaches: here
    every token picks among 8 of 64, so 2,048 tokens still touch 8 (uniform routing: all 64), each read once a
    tile of its rows (planner/cost/expert_reads.py); uniform shares give the uniform figure exactly."""
    experts, top_k = 64, 4
    layer = _layer({"mlp.experts.gate_up_proj": [experts, 100, 100]}, offloaded=["mlp.experts.gate_up_proj"],
                   moe=MoeSpec(experts=experts, top_k=top_k), uva=True)
    hot = [0.5 if e < 8 else 0.0 for e in range(experts)]  # 8 experts, each picked by half the tokens
    hit, rows = touched_by(hot, tokens)
    assert hit == pytest.approx(8 * (1 - 0.5 ** tokens))
    work = layer_work(layer, tokens, HW, shares=hot)
    # each hot expert sees r ~ Binomial(tokens, 0.5) rows, read ceil(r / 128) times: once up to 128 rows; at
    # 2,048 tokens 8 times, or 9 (about half the time, r > 1,024), times the curve's share of the uniform tiles
    reads = tiles(hot, tokens)
    assert reads == pytest.approx({1: 4.0, 32: 8.0, 2048: 8 * 8.5}[tokens], rel=0.01)
    read = 2 * 100 * 100 * measured_reads(hot, (experts, top_k), tokens, HW) / 0.5e9 * 1e3  # an expert's bytes
    flat = uniform_reads((experts, top_k), tokens, HW) / tiles([top_k / experts] * experts, tokens)
    assert read == pytest.approx(2 * 100 * 100 * reads * flat / 0.5e9 * 1e3)
    # at 2,048 tokens (128 rows an expert over the 64) the runtime pads the call to torch's tall tiles
    # (runtime/experts_forward.py): each hot expert's ~1,024 rows in tiles of 256, 4 or 5 (r > 1,024, half the time),
    # times the same share of the tiles the curve reads (``flat``) as the short tiles above
    tall = taller_tiles((experts, top_k), tokens, experts)
    assert tall == (tokens == 2048)
    if tall:
        assert tiles(hot, tokens, 2 * TILE_ROWS) == pytest.approx(8 * 4.5, rel=0.01)
        read = 2 * 100 * 100 * tiles(hot, tokens, 2 * TILE_ROWS) * flat / 0.5e9 * 1e3
    assert work.gpu_ms == pytest.approx(max(2 * rows * 100 * 100 / 1e12 * 1e3, read))
    assert work.cpu_ms == pytest.approx((HW.moe_block_cpu_us + HW.expert_cpu_us * hit) / 1e3)
    uniform = [top_k / experts] * experts
    assert layer_work(layer, tokens, HW, shares=uniform).gpu_ms == pytest.approx(layer_work(layer, tokens, HW).gpu_ms)
    if tokens > 1:
        assert work.gpu_ms < layer_work(layer, tokens, HW).gpu_ms
    # predict threads the routing of each layer by name to whole layers too
    plan_layers = [layer]
    assert layers_work(plan_layers, tokens, HW, routing={layer.name: hot})[0] == work
    assert layers_work(plan_layers, tokens, HW, routing={"other": hot})[0] == layer_work(layer, tokens, HW)


@pytest.mark.parametrize("tokens", [32, 2048])
def test_uva_experts_use_the_grouped_kernels_passes_and_rate(tokens):
    """A profile that measured its grouped expert matmuls (``uva_expert_passes``, ``expert_tflops``) prices routed
    experts with them, not with a dense matmul's re-reads and rate; dense params keep the dense figures."""
    experts, top_k = 64, 4
    layer = _layer({"mlp.experts.gate_up_proj": [experts, 100, 100], "self_attn.q_proj.weight": [100, 100]},
                   offloaded=["mlp.experts.gate_up_proj", "self_attn.q_proj.weight"],
                   moe=MoeSpec(experts=experts, top_k=top_k), uva=True)
    grouped = HW.model_copy(update={"uva_expert_passes": [UvaPoint(tokens=1, passes=1.0),
                                                          UvaPoint(tokens=512, passes=1.25)],
                                    "expert_tflops": 0.25})
    hit = touched_experts(experts, top_k, tokens)
    rows = tokens * top_k / hit
    assert grouped.expert_passes(rows) == pytest.approx(1.0 + 0.25 * (rows - 1) / 511)
    assert HW.expert_passes(rows) == HW.passes(rows)  # no grouped figures: the dense ones
    assert grouped.experts_tflops == 0.25 and HW.experts_tflops == HW.matmul_tflops
    by_param = {t.rel: t for t in layer_times(layer.name, layer.params.items(), (experts, top_k), tokens, grouped)[0]}
    expert = by_param["mlp.experts.gate_up_proj"]
    # at 2,048 tokens (128 rows an expert) the runtime's padded call takes tall tiles: a tile of 256 rows an expert
    # (~128 rows each: one), times the share of its tiles of 128 the curve reads at these rows
    passes = grouped.expert_passes(rows)
    if taller_tiles((experts, top_k), tokens, experts):
        uniform = [top_k / experts] * experts
        assert tiles(uniform, tokens, 2 * TILE_ROWS) == pytest.approx(experts, rel=1e-3)
        passes = max(1.0, tiles(uniform, tokens, 2 * TILE_ROWS) * hit * passes / tiles(uniform, tokens) / hit)
    assert (passes < grouped.expert_passes(rows)) == (tokens == 2048)
    read = 2 * experts * 100 * 100 * hit / experts * passes / 0.5e9 * 1e3
    flops = 2 * tokens * top_k * 100 * 100 / (0.25 * 1e12) * 1e3
    assert expert.uva_ms == pytest.approx(max(read, flops))
    assert expert.gpu_ms == pytest.approx(max(flops, 2 * experts * 100 * 100 * hit / experts / HW.gpu_mem_gbps / 1e6))
    dense = layer_times(layer.name, layer.params.items(), (experts, top_k), tokens, HW)[0]
    assert by_param["self_attn.q_proj.weight"] == next(t for t in dense if t.rel == "self_attn.q_proj.weight")


def test_uva_passes_interpolate_in_tokens_and_extrapolate():
    assert HW.passes(1) == 1.0 and HW.passes(16) == 1.0
    assert HW.passes(136) == pytest.approx(1.5)
    assert HW.passes(8192) == pytest.approx(16 + 14 * 4096 / 3840)


def test_bundled_profile_loads_and_bad_names_are_refused():
    from schemas.errors import InputError

    assert load_hardware("h200").h2d_gbps > 40
    with pytest.raises(InputError, match="did you mean 'h200'"):
        load_hardware("h20")


def test_a_mid_layer_sync_stops_the_cpu_running_ahead():
    # layer 0: 5 ms of GPU work issued in 1 ms; layer 1 syncs before its expert part (2 ms GPU, 1 ms CPU)
    sync = LayerWork(gpu_ms=3, cpu_ms=2, copy_ms=0, copy_bytes=0, synced_gpu_ms=2, synced_cpu_ms=1)
    t = simulate([w(5, cpu=1), sync], [])
    # layer 1's first part (1 ms GPU, 1 ms CPU) runs at [5, 6]; the CPU waits until 6, issues the
    # expert part until 7; it ends at max(6 + 2, 7) = 8
    assert t.layers[1].start == 5 and t.step_ms == 8
    free = simulate([w(5, cpu=1), LayerWork(gpu_ms=3, cpu_ms=2, copy_ms=0, copy_bytes=0)], [])
    assert free.step_ms == 8  # here the GPU bounds both; a slow CPU part shows the difference:
    slow = LayerWork(gpu_ms=3, cpu_ms=5, copy_ms=0, copy_bytes=0, synced_gpu_ms=2, synced_cpu_ms=4)
    assert simulate([w(5, cpu=1), slow], []).step_ms == 6 + 4 + 0  # waits for 6, then 4 ms of CPU
    assert simulate([w(5, cpu=1), LayerWork(3, 5, 0, 0)], []).step_ms == 8  # no sync: CPU ran ahead


def test_describe_reads_experts_and_top_k_from_moe_routers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import runtime

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16)
    with torch.device("meta"):
        qwen = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, **small))
        mixtral = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            num_local_experts=4, num_experts_per_tok=1, **{k: v for k, v in small.items() if k != "head_dim"}))
        llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))
    for model, want in ((qwen, (8, 2)), (mixtral, (4, 1))):
        layers = runtime.describe(model).model.expanded()
        moe = {(layer.moe.experts, layer.moe.top_k) for layer in layers if layer.moe is not None}
        assert moe == {want}
        assert sum(layer.moe is not None for layer in layers) == 2  # the two decoder blocks only
    assert all(layer.moe is None for layer in runtime.describe(llama).model.expanded())


def test_the_spec_workload_and_hardware_set_the_predictions(tmp_path):
    import planner
    from cli_samples import TINY_SPEC, invoke
    from schemas.io import load_spec

    f = tmp_path / "spec.yaml"
    f.write_text(TINY_SPEC.replace("offload:", "workload: {decode: {tokens: 1}, prefill: {tokens: 512, weight: 0.25}}\n"
                                               "hardware: h200\noffload:"))
    plan = planner.plan(load_spec(f), gpu_budget=10**6)
    rows = {p.workload: p for p in plan.predictions.workloads}
    assert rows["prefill"].tokens == 512 and rows["prefill"].weight == 0.25 and rows["decode"].tokens == 1
    weighted = (rows["decode"].step_ms + 0.25 * rows["prefill"].step_ms) / 1.25
    assert plan.predictions.weighted_step_ms == pytest.approx(weighted, abs=1e-3)
    assert plan.predictions.hardware == "h200"
    result = invoke("plan", str(f), "--tokens", "8", "--gpu-budget", "1MB")  # the command line replaces the spec's workload
    assert result.exit_code == 0, result.output
    assert "workload: decode\n      tokens: 8" in result.stdout and "prefill" not in result.stdout.split("layers:")[0]


def test_a_calibrated_profile_file_round_trips(tmp_path):
    from schemas.io import dump_model

    f = tmp_path / "gpu.yaml"
    f.write_text(dump_model(HW, "yaml"))
    assert load_hardware(str(f)) == HW


def test_the_experts_compute_rate_follows_the_rows_an_expert_sees():
    """``expert_tflops_rows``: grouped expert matmuls compute slower the fewer rows each touched expert sees (on the
    H200 122 TFLOP/s at 128 rows, 199 at 2,048); linear between the points, flat outside; a routing that sends the
    same tokens to fewer experts (more rows each) computes faster; without the points, ``expert_tflops``."""
    from schemas.hardware_profile import TflopsPoint

    experts, top_k, tokens = 64, 4, 2048
    rows_hw = HW.model_copy(update={"expert_tflops": 0.4, "expert_tflops_rows": [
        TflopsPoint(tokens=128, tflops=0.1), TflopsPoint(tokens=512, tflops=0.3)]})
    assert [rows_hw.experts_tflops_at(r) for r in (1, 128, 320, 512, 4096)] == pytest.approx([0.1, 0.1, 0.2, 0.3, 0.3])
    assert HW.experts_tflops_at(128) == HW.experts_tflops
    layer = _layer({"mlp.experts.gate_up_proj": [experts, 1000, 1000]}, moe=MoeSpec(experts=experts, top_k=top_k))
    rel = "mlp.experts.gate_up_proj"

    def gpu_ms(hw, shares=None):
        return next(t for t in layer_times(layer.name, layer.params.items(), (experts, top_k), tokens, hw,
                                           shares=shares)[0] if t.rel == rel).gpu_ms

    flops = 2 * tokens * top_k * 1000 * 1000  # uniform: 64 experts touched, 128 rows each
    assert gpu_ms(rows_hw) == pytest.approx(flops / (0.1 * 1e12) * 1e3)
    hot = [top_k / 16] * 16 + [0.0] * 48  # 16 experts, 512 rows each: the same flops at the faster rate
    assert gpu_ms(rows_hw, hot) == pytest.approx(flops / (0.3 * 1e12) * 1e3)
    assert gpu_ms(HW.model_copy(update={"expert_tflops": 0.4})) == pytest.approx(flops / (0.4 * 1e12) * 1e3)
    with pytest.raises(ValueError, match="increasing tokens"):
        HardwareProfile.model_validate({**HW.model_dump(), "expert_tflops_rows": [
            {"tokens": 512, "tflops": 0.3}, {"tokens": 128, "tflops": 0.1}]})


def test_a_dense_matmul_reads_its_weight_at_the_rate_of_its_rows():
    """``matmul_gbps_rows``: a resident matmul of a few dozen rows reads its weight slower than a GEMV (the H200's
    Llama-3-8B shape replayed a decode step at 32 tokens in 9.0 ms, at 1 token in 7.1, priced alike without it);
    linear between the points, flat outside; a UVA read, a vector and a lookup keep their rates; without the points,
    ``gpu_mem_gbps`` at any rows."""
    from schemas.hardware_profile import RatePoint

    hw = HW.model_copy(update={"matmul_tflops": 1000.0})  # memory-bound at decode rows, as a real GPU
    rows_hw = hw.model_copy(update={"matmul_gbps_rows": [RatePoint(tokens=1, gbps=HW.gpu_mem_gbps),
                                                          RatePoint(tokens=64, gbps=HW.gpu_mem_gbps / 2)]})
    assert rows_hw.matmul_gbps_at(1) == HW.gpu_mem_gbps
    assert rows_hw.matmul_gbps_at(32.5) == pytest.approx(HW.gpu_mem_gbps * 0.75)
    assert rows_hw.matmul_gbps_at(4096) == HW.gpu_mem_gbps / 2
    assert hw.matmul_gbps_at(32) == HW.gpu_mem_gbps
    layer = _layer({"mlp.up_proj.weight": [4096, 4096], "input_layernorm.weight": [4096]})

    def times(hw, tokens):
        return {t.rel: t for t in layer_times(layer.name, layer.params.items(), None, tokens, hw)[0]}

    nbytes = 4096 * 4096 * 2
    for tokens in (1, 32):
        t = times(rows_hw, tokens)["mlp.up_proj.weight"]
        flops_ms = 2 * tokens * 4096 * 4096 / (hw.matmul_tflops * 1e9)
        read_ms = nbytes / rows_hw.matmul_gbps_at(tokens) / 1e6
        assert t.gpu_ms == pytest.approx(max(flops_ms, read_ms))
        assert read_ms > flops_ms  # the test's shape is memory-bound at these rows
    assert times(rows_hw, 32)["mlp.up_proj.weight"].gpu_ms > times(hw, 32)["mlp.up_proj.weight"].gpu_ms
    assert times(rows_hw, 1)["mlp.up_proj.weight"].gpu_ms == times(hw, 1)["mlp.up_proj.weight"].gpu_ms
    for tokens in (1, 32):  # the link's reads and a vector's are not a dense matmul's GPU-memory read
        a, b = times(rows_hw, tokens), times(hw, tokens)
        assert a["mlp.up_proj.weight"].uva_ms == b["mlp.up_proj.weight"].uva_ms
        assert a["input_layernorm.weight"].gpu_ms == b["input_layernorm.weight"].gpu_ms
    with pytest.raises(ValueError, match="increasing tokens"):
        HardwareProfile.model_validate({**HW.model_dump(), "matmul_gbps_rows": [
            {"tokens": 64, "gbps": 1000.0}, {"tokens": 1, "gbps": 2000.0}]})


def test_the_forward_outside_its_blocks_costs_the_cpu_before_the_first_layer():
    """``model_cpu_us`` (an eager forward's own Python outside its blocks: 2.3-3.5 ms on the Llama-3-8B shape's
    decode on the H200's host, 2026-12-02): the CPU's clock starts there, so a CPU-bound step grows by it and a
    GPU-bound one by no more; graph replay pays none of it."""
    from planner.cost.layer import model_cpu_ms

    cpu_bound = [w(1.0, cpu=3.0) for _ in range(4)]
    gpu_bound = [w(5.0, cpu=0.1) for _ in range(4)]
    for work in (cpu_bound, gpu_bound):
        base = simulate(work, []).step_ms
        later = simulate(work, [], cpu_start=2.0).step_ms
        assert base < later <= base + 2.0
    assert simulate(cpu_bound, [], cpu_start=2.0).step_ms == pytest.approx(simulate(cpu_bound, []).step_ms + 2.0)
    assert simulate(cpu_bound, [], cpu_start=2.0).cpu_ms == pytest.approx(14.0)
    hw = HW.model_copy(update={"model_cpu_us": 2000.0})
    assert model_cpu_ms(hw) == 2.0 and model_cpu_ms(HW) == 0.0
    # a copy triggered at the forward's start is issued when the CPU gets there
    t = simulate([w(1.0, cpu=0.1), w(1.0, copy=3.0, cpu=0.1)], [Copy(layer=1, trigger=0, previous_forward=False)],
                 cpu_start=2.0)
    assert t.layers[1].copy_start == pytest.approx(2.0)


def test_a_plans_eager_prediction_counts_the_model_outside_its_blocks():
    """``predict`` on a whole plan: an eager decode (CPU-bound on the bundled profile) grows by ``model_cpu_us``,
    its CUDA graph replay not at all."""
    from pathlib import Path

    import planner
    from planner.cost.predict import predict
    from schemas import load_spec
    from schemas.workload import Workload, WorkloadItem

    spec = load_spec(Path(__file__).resolve().parent.parent / "examples" / "llama-3.2-1b.yaml")
    hw = load_hardware("h200")
    plan = planner.plan(spec, backend="none", hardware=hw, gpu_budget=8 * 2**30)
    both = Workload({"eager": WorkloadItem(tokens=1), "graph": WorkloadItem(tokens=1, mode="graph")})
    before = {p.workload: p for p in predict(plan, hw, both).workloads}
    after = {p.workload: p for p in predict(plan, hw.model_copy(update={"model_cpu_us": 2500.0}), both).workloads}
    assert before["eager"].bound == "cpu"
    assert after["eager"].step_ms == pytest.approx(before["eager"].step_ms + 2.5, abs=1e-3)
    assert after["graph"].step_ms == before["graph"].step_ms
