"""The memory a plan counts besides the weights (planner/memory): KV cache and activation bytes against figures
worked out by hand for a dense model, a grouped-query model, an MoE model and a model with tied embeddings;
the parts adding up to the plan's peak within the budget; infeasible budgets naming the part that does not
fit; hand edits of the parts refused at load; the KV cache that --kv-cache auto leaves; the batch chosen for
tokens per second."""

from __future__ import annotations

import copy
import json

import pytest
from cli_samples import invoke
from conftest import EXAMPLES

import planner
from planner.errors import InfeasibleError, PlanningError
from planner.memory.parts import MemoryModel, forward_of
from schemas import SpecFile, dump_model, load_spec
from schemas.hardware import load_hardware
from schemas.io import load_model
from schemas.plan import Plan
from schemas.workload import Workload, WorkloadItem

GENERATED = EXAMPLES / "generated"
H200 = load_hardware("h200")
WORKSPACE = 32 * 2**20


def spec_of(name: str) -> SpecFile:
    return load_spec(GENERATED / f"{name}.yaml")


def forward(spec: SpecFile, name: str, **item) -> tuple[int, int, str]:
    """(KV cache bytes, activation bytes, where) of one forward of ``spec``."""
    sizes = MemoryModel(spec.model, spec.model.expanded(), spec.memory)
    f = sizes.forward(name, forward_of(name, WorkloadItem(**item)))
    return f.kv_cache_bytes, f.activation_bytes, f.largest


def dense_spec() -> SpecFile:
    """Multi-head attention (q, k and v all 64 wide), a gated MLP of 256, a 1,000-token vocabulary, 2 blocks."""
    block = {"self_attn.q_proj.weight": [64, 64], "self_attn.k_proj.weight": [64, 64],
             "self_attn.v_proj.weight": [64, 64], "self_attn.o_proj.weight": [64, 64],
             "mlp.gate_proj.weight": [256, 64], "mlp.up_proj.weight": [256, 64], "mlp.down_proj.weight": [64, 256],
             "input_layernorm.weight": [64], "post_attention_layernorm.weight": [64]}
    return SpecFile.model_validate({"model": {"name": "dense", "dtype": "bfloat16", "layers": [
        {"name": "model.embed_tokens", "params": {"weight": [1000, 64]}},
        {"name": "model.layers.{i}", "repeat": 2, "params": block},
        {"name": "model.norm", "params": {"weight": [64]}},
        {"name": "lm_head", "params": {"weight": [1000, 64]}}]}})


# -- the KV cache, by hand: layers x (k width + v width) x bytes an element ------------------------------

def test_kv_bytes_per_token_by_hand():
    assert MemoryModel(*_parts(dense_spec())).kv.per_token == 2 * (64 + 64) * 2  # multi-head: k and v as wide as q
    assert MemoryModel(*_parts(spec_of("llama-3-8b"))).kv.per_token == 32 * (1024 + 1024) * 2  # GQA: 8 of 32 heads
    assert MemoryModel(*_parts(spec_of("qwen3-30b-a3b"))).kv.per_token == 48 * (512 + 512) * 2  # MoE: 4 KV heads
    assert MemoryModel(*_parts(spec_of("llama-3.2-1b"))).kv.per_token == 16 * (512 + 512) * 2  # tied embeddings


def _parts(spec: SpecFile):
    return spec.model, spec.model.expanded(), spec.memory


def test_the_cache_dtype_and_a_given_size_per_token():
    spec = spec_of("llama-3-8b")
    fp8 = spec.model_copy(update={"memory": spec.memory.model_copy(update={"kv_cache_dtype": "float8_e4m3fn"})})
    assert MemoryModel(*_parts(fp8)).kv.per_token == 32 * 2048 * 1
    given = spec.model_copy(update={"memory": spec.memory.model_copy(update={"kv_bytes_per_token": 1000})})
    assert forward(given, "decode", batch=3, context=10)[0] == 3 * 10 * 1000


def test_a_decode_batch_holds_batch_times_context_tokens():
    kv, _, _ = forward(spec_of("llama-3-8b"), "decode", batch=32, context=4096)
    assert kv == 32 * 4096 * 131072 == 16 * 2**30  # 16 GiB, the figure of issue 20


def test_a_fused_qkv_needs_the_heads_and_a_latent_attention_is_cached_per_head():
    fused = dense_spec().model_dump(mode="json", exclude_none=True)
    block = fused["model"]["layers"][1]["params"]
    for k in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        del block[k]
    block["self_attn.qkv_proj.weight"] = [64 + 2 * 16, 64]  # 8 heads of 8, 2 KV heads
    spec = SpecFile.model_validate(fused)
    with pytest.raises(PlanningError, match="model.attention: {heads: H, kv_heads: K}"):
        forward(spec, "decode", batch=1, context=8)
    assert forward(spec, "decode", tokens=1)[0] == 0  # without a context the cache is never sized
    fused["model"]["attention"] = {"heads": 8, "kv_heads": 2}
    assert MemoryModel(*_parts(SpecFile.model_validate(fused))).kv.per_token == 2 * (16 + 16) * 2
    # DeepSeek-V2-Lite: keys as wide as the queries (16 heads x 192), values 16 x 128, per layer
    deepseek = spec_of("deepseek-v2-lite")
    with pytest.raises(PlanningError, match="latent attention"):
        forward(deepseek, "decode", batch=1, context=8)
    data = deepseek.model_dump(mode="json", exclude_none=True)
    data["model"]["attention"] = {"heads": 16}
    assert MemoryModel(*_parts(SpecFile.model_validate(data))).kv.per_token == 27 * (3072 + 2048) * 2


# -- activations, by hand (planner/memory/activations.py's rules) --------------------------------------

def test_dense_activations_by_hand():
    t, h, i, v = 16, 64, 256, 1000
    carried = 2 * t * h * 2
    mlp = carried + 2 * t * h * 2 + 3 * t * i * 2
    attention = carried + (t * h + t * 192 + 3 * t * 64) * 2
    head = (t * h + t * v) * 2
    _, act, where = forward(dense_spec(), "prefill", tokens=t)
    assert (act, where) == (max(mlp, attention, head), "lm_head: logits (16 x 1000)") and head > mlp > attention
    # generate()'s logits: the last token's, with a float32 copy and the scores; the MLP peaks then, beside
    # generate()'s ids, mask and positions (six int64 tensors of the 16 tokens) and the last step's scores
    _, act, where = forward(dense_spec(), "prefill", tokens=t, logits="last")
    assert (act, where) == (mlp + 6 * t * 8 + 1 * v * 4, "model.layers.0: mlp (gate, up and their product)")


def test_gqa_decode_and_prefill_by_hand():
    llama = spec_of("llama-3-8b")
    # decode, 32 sequences at 4,096: the attention stage, where one layer's keys and values are repeated for
    # each of the 32 query heads (2 GiB; more than a dynamic cache's growth, one layer's keys, 256 MiB), and
    # one layer's keys and values once more (512 MiB)
    b, c = 32, 4096
    carried = 2 * b * 4096 * 2
    attention = (carried + (b * 4096 + b * (4096 + 1024 + 1024) + 3 * b * 4096) * 2
                 + (2 * 4096 + 1024 + 1024) * b * c * 2)
    assert forward(llama, "decode", batch=b, context=c)[1:] == (attention, "model.layers.0: attention")
    # generate() (logits last) also holds its ids, mask and positions (six int64 tensors of 32 x 4,096) and the
    # last step's float32 scores
    kept = 6 * b * c * 8 + b * 128256 * 4
    head_last = (b * 4096 + b * 128256) * 2 + b * 128256 * 8
    assert forward(llama, "decode", batch=b, context=c, logits="last")[1] == max(attention, head_last) + kept
    # a 2,048-token prefill returning every logit: the LM head
    head = (2048 * 4096 + 2048 * 128256) * 2
    assert forward(llama, "prefill", tokens=2048)[1:] == (head, "lm_head: logits (2048 x 128256)")


def test_moe_prefill_by_hand():
    qwen = spec_of("qwen3-30b-a3b")
    t, h, e, k, i = 2048, 2048, 128, 8, 768
    rows = t * k
    experts = 4 * t * h * 2 + max(rows * (h + 4 * i), 4 * rows * h) * 2 + t * e * (2 + 4) + rows * 8 * 3
    _, act, where = forward(qwen, "prefill", tokens=t, logits="last")
    assert (act, where) == (experts + 6 * t * 8 + 151936 * 4, "model.layers.0: routed experts (8 of 128 a token)")
    head = (t * h + t * 151936) * 2
    assert forward(qwen, "prefill", tokens=t)[1] == head > experts


def test_moe_prefill_in_the_padded_band_by_hand():
    """At 1,040 tokens (65 rows an expert) the runtime pads the grouped call to 129 rows an expert for torch's tall
    tiles (schemas/grouped_tiles.py): the gathered inputs, their padded copy and the padded up output outgrow the
    unpadded peak, and the plan counts them."""
    qwen = spec_of("qwen3-30b-a3b")
    t, h, e, k, i = 1040, 2048, 128, 8, 768
    rows, padded = t * k, 129 * e
    assert padded > rows
    unpadded = max(rows * (h + 4 * i), 4 * rows * h)
    padded_call = rows * h + padded * (h + 2 * i)
    assert padded_call > unpadded
    experts = 4 * t * h * 2 + padded_call * 2 + t * e * (2 + 4) + rows * 8 * 3
    _, act, where = forward(qwen, "prefill", tokens=t, logits="last")
    assert (act, where) == (experts + 6 * t * 8 + 151936 * 4, "model.layers.0: routed experts (8 of 128 a token)")


def test_tied_embeddings_head_by_hand():
    _, act, where = forward(spec_of("llama-3.2-1b"), "decode", tokens=1)
    assert (act, where) == ((2048 + 128256) * 2, "lm_head: logits (1 x 128256)")  # the head ties the embedding


# -- the plan: parts that add up, within the budget ------------------------------------------------------

def test_the_plans_peak_is_the_whole_gpu_and_reloads():
    budget = 24 * 10**9
    plan = planner.plan(spec_of("llama-3-8b"), gpu_budget=budget,
                        workload=Workload({"decode": WorkloadItem(batch=32, context=4096)}))
    s, mem = plan.summary, plan.memory
    assert mem.kv_cache_bytes == 16 * 2**30 and mem.workspace_bytes == WORKSPACE
    assert s.peak_gpu_bytes == s.resident_bytes + s.buffer_bytes + mem.kv_cache_bytes + mem.activation_bytes + WORKSPACE
    assert s.peak_gpu_bytes <= budget and s.offloaded_bytes > 0  # 16 GiB of cache pushes weights to the host
    assert load_model(Plan, "p.yaml", dump_model(plan)) == plan


def test_without_a_context_no_kv_cache_is_counted_and_the_plan_says_so():
    plan = planner.plan(spec_of("llama-3-8b"), gpu_budget=12 * 10**9)
    assert plan.memory.kv_cache_bytes == 0 and plan.memory.forwards[0].context == 0
    assert any("no context given, so no KV cache is counted" in n for n in plan.summary.notes)


def test_infeasible_names_the_part_that_does_not_fit_and_its_smallest_budget_fits():
    spec = spec_of("llama-3-8b")
    kv = Workload({"decode": WorkloadItem(batch=64, context=4096)})
    with pytest.raises(InfeasibleError) as err:
        planner.plan(spec, gpu_budget=20 * 10**9, workload=kv)
    assert "the KV cache for 64 x 4,096 tokens alone needs 32.00 GiB, more than the" in err.value.message
    assert "with every weight offloaded that can be, the smallest gpu_budget is" in err.value.message
    plan = planner.plan(spec, gpu_budget=err.value.min_gpu_budget, workload=kv)
    assert plan.summary.peak_gpu_bytes <= err.value.min_gpu_budget
    logits = Workload({"prefill": WorkloadItem(tokens=65536)})  # 16.8 GB of logits
    with pytest.raises(InfeasibleError, match=r"the activations of prefill \(65,536 tokens, at lm_head: logits"):
        planner.plan(spec, gpu_budget=8 * 10**9, workload=logits)
    with pytest.raises(InfeasibleError, match="the workspace alone needs 32.00 MiB"):
        planner.plan(dense_spec(), gpu_budget=10**6)
    # the parts fit, the weights do not: what is left for them, and why not
    with pytest.raises(InfeasibleError) as err:
        planner.plan(spec_of("llama-3.2-1b"), gpu_budget=10**9, workload=Workload(
            {"decode": WorkloadItem(batch=4, context=4096)}))
    assert "which leaves" in err.value.message and "weights and buffers alone:" in err.value.message


def test_kv_cache_auto_takes_what_the_plan_leaves_and_says_how_many_sequences():
    budget = 24 * 10**9
    plan = planner.plan(spec_of("llama-3-8b"), gpu_budget=budget, kv_cache="auto",
                        workload=Workload({"decode": WorkloadItem(batch=1, context=4096)}))
    mem = plan.memory
    assert plan.summary.peak_gpu_bytes == budget and mem.kv_cache == "auto"
    sequences = mem.kv_cache_bytes // (4096 * 131072)
    assert any(f"room for {sequences:,} sequences of 4,096 tokens" in n for n in plan.summary.notes)
    assert load_model(Plan, "p.yaml", dump_model(plan)) == plan
    reserved = planner.plan(spec_of("llama-3-8b"), gpu_budget=budget, kv_cache=8 * 2**30,
                            workload=Workload({"decode": WorkloadItem(batch=1, context=4096)}))
    assert reserved.memory.kv_cache_bytes == 8 * 2**30 and reserved.memory.kv_cache == "reserved"
    with pytest.raises(PlanningError, match="less than the KV cache for 32 x 4,096 tokens"):
        planner.plan(spec_of("llama-3-8b"), gpu_budget=budget, kv_cache=2**30,
                     workload=Workload({"decode": WorkloadItem(batch=32, context=4096)}))


def test_the_spec_overrides_activations_and_workspace():
    spec = spec_of("llama-3-8b")
    mine = spec.model_copy(update={"memory": spec.memory.model_copy(update={"activations": 10**8, "workspace": 0})})
    plan = planner.plan(mine, gpu_budget=12 * 10**9, workload=Workload({"prefill": WorkloadItem(tokens=2048)}))
    assert (plan.memory.activation_bytes, plan.memory.workspace_bytes, plan.memory.activations) == (10**8, 0, "spec")


def test_a_context_adds_the_cache_read_to_a_graph_decode():
    spec = spec_of("llama-3-8b")
    steps = [planner.plan(spec, gpu_budget=60 * 10**9, workload=Workload(
        {"decode": WorkloadItem(batch=32, context=c, mode="graph")})).predictions.workloads[0] for c in (1, 8192)]
    # nothing offloaded: the step is the compute stream's; the grouped keys and values of 32 x 8,192 tokens (32 GiB)
    # are copied out for the 32 query heads by transformers' repeat_kv (read 32 GiB, write 128 GiB: a strided copy)
    # and SDPA reads the 128 GiB copies at kv_read_gbps (planner/cost/block.py)
    copied, read = 131072 + 32 * 2 * 4096 * 2, 32 * 2 * 4096 * 2
    per_token_ms = copied / H200.strided_copy_gbps / 1e6 + read / H200.kv_read_gbps / 1e6
    assert steps[1].compute_ms - steps[0].compute_ms == pytest.approx(32 * 8191 * per_token_ms, rel=1e-3)


def test_the_experts_decode_graphs_are_counted_once_whatever_the_layers_and_only_for_stacked_experts():
    """Qwen3-30B-A3B (48 layers, stacked experts): 8 shapes' static tensors at 64 tokens (hidden states in and out,
    8 int64 ids and float32 weights a token) and the pool's segments, small ones for all of a capture's blocks and
    one large, by hand; a dense model and experts held
    one module each count none; the spec's memory.graphs replaces the figure and leaves its hash alone unset."""
    from schemas.spec_hash import spec_sha256

    spec = spec_of("qwen3-30b-a3b")
    static = 2 * 64 * 2048 * 2 + 64 * 8 * (8 + 4)
    plan = planner.plan(spec, gpu_budget=40 * 10**9)
    s, mem = plan.summary, plan.memory
    work = 64 * 8 * 4 * 2048 * 2  # the routed experts' rows at 64 tokens: four [512, 2048] tensors (8 MiB)
    assert mem.graph_bytes == 8 * static + (work // (2 * 2**20)) * 2 * 2**20 + 20 * 2**20  # small and large segments
    assert s.peak_gpu_bytes == (s.resident_bytes + s.buffer_bytes + mem.kv_cache_bytes + mem.activation_bytes
                                + mem.workspace_bytes + mem.graph_bytes)
    assert load_model(Plan, "p.yaml", dump_model(plan)) == plan
    assert planner.plan(spec_of("llama-3-8b"), gpu_budget=40 * 10**9).memory.graph_bytes == 0
    assert planner.plan(load_spec(EXAMPLES / "mixtral-8x7b.yaml"), gpu_budget=40 * 10**9).memory.graph_bytes == 0
    mine = spec.model_copy(update={"memory": spec.memory.model_copy(update={"graphs": 0})})
    assert planner.plan(mine, gpu_budget=40 * 10**9).memory.graph_bytes == 0
    assert spec_sha256(spec) != spec_sha256(mine) and "graphs" not in dump_model(spec)
    tight = planner.plan(spec, gpu_budget=s.peak_gpu_bytes)
    assert tight.summary.peak_gpu_bytes <= s.peak_gpu_bytes  # the budget that held the graphs still holds them


# -- hand edits ---------------------------------------------------------------------------------------

def _plan_data() -> dict:
    plan = planner.plan(spec_of("llama-3-8b"), gpu_budget=24 * 10**9,
                        workload=Workload({"decode": WorkloadItem(batch=8, context=4096)}))
    return json.loads(json.dumps(plan.model_dump(mode="json", exclude_none=True)))


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["memory"].update(kv_cache_bytes=d["memory"]["kv_cache_bytes"] // 2), "memory.kv_cache_bytes"),
    (lambda d: d["memory"].update(activation_bytes=1), "memory.activation_bytes"),
    (lambda d: d["memory"].update(workspace_bytes=0), "summary.peak_gpu_bytes"),
    (lambda d: d["memory"].update(graph_bytes=2**20), "summary.peak_gpu_bytes"),
    (lambda d: d["memory"]["forwards"][0].update(kv_cache_bytes=1), "memory.forwards[0].kv_cache_bytes"),
    (lambda d: d["memory"]["forwards"][0].update(context=2048), "memory.forwards[0].kv_cache_bytes"),
    (lambda d: d["memory"]["forwards"][0].update(batch=9), "memory.forwards[0].batch"),
    (lambda d: d["memory"]["forwards"][0].update(tokens=4), "memory.forwards[0].tokens"),
    (lambda d: d["memory"].update(kv_bytes_per_token=1), "memory.forwards[0].kv_cache_bytes"),
    (lambda d: d["summary"].update(peak_gpu_bytes=d["summary"]["peak_gpu_bytes"] - 1), "summary.peak_gpu_bytes"),
])
def test_hand_edited_parts_are_refused_at_load(edit, field):
    data = _plan_data()
    assert load_model(Plan, "p.json", json.dumps(data))
    edit(data)
    with pytest.raises(Exception) as err:
        load_model(Plan, "p.json", json.dumps(data))
    assert field in str(err.value)


def test_a_plan_without_the_memory_section_still_loads():
    data = _plan_data()
    mem = data.pop("memory")
    data["summary"]["peak_gpu_bytes"] -= mem["kv_cache_bytes"] + mem["activation_bytes"] + mem["workspace_bytes"]
    plan = load_model(Plan, "old.json", json.dumps(data))
    assert plan.memory is None
    out = invoke("show", "-", stdin=dump_model(plan))
    peak = next(line for line in out.stdout.splitlines() if "; peak GPU " in line)
    assert out.exit_code == 0 and "(resident " in peak and "KV cache" not in peak


# -- tokens per second --------------------------------------------------------------------------------

def test_batch_auto_finds_the_most_tokens_per_second():
    spec = spec_of("llama-3-8b")
    budget = 24 * 10**9
    plan = planner.plan(spec, gpu_budget=budget, workload=Workload({"decode": WorkloadItem(batch="auto", context=4096)}))
    t = plan.throughput
    assert t is not None and plan.memory.forwards[0].batch == t.batch == plan.predictions.workloads[0].tokens
    assert t.tokens_per_s == max(o.tokens_per_s for o in t.options)
    by_hand = {}
    for b in range(1, 49):  # every batch, planned on its own
        try:
            p = planner.plan(spec, gpu_budget=budget, workload=Workload({"decode": WorkloadItem(batch=b, context=4096)}))
        except InfeasibleError:
            break
        by_hand[b] = b * 1000 / p.predictions.workloads[0].step_ms
    assert t.tokens_per_s >= 0.99 * max(by_hand.values())
    assert load_model(Plan, "p.yaml", dump_model(plan)) == plan
    data = json.loads(json.dumps(plan.model_dump(mode="json", exclude_none=True)))
    worse = copy.deepcopy(data)
    worse["throughput"]["batch"] = next(o["batch"] for o in data["throughput"]["options"] if o["batch"] != t.batch)
    with pytest.raises(Exception, match="throughput"):
        load_model(Plan, "p.json", json.dumps(worse))


def test_objective_throughput_on_the_command_line(tmp_path):
    out = tmp_path / "p.yaml"
    result = invoke("plan", str(GENERATED / "llama-3-8b.yaml"), "-g", "24GB", "--context", "4096",
                    "--objective", "throughput", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    shown = invoke("show", str(out))
    assert "chosen for decode at 4,096 tokens" in shown.stdout and "tokens/s predicted" in shown.stdout


def test_auto_costs_the_cache_read_as_the_plans_prediction_does():
    """strategy auto's own step (planner/cost/placement.py) reads the KV cache as the plan's prediction does."""
    from planner.cost.placement import PlacementCost

    spec = spec_of("llama-3-8b")
    workload = Workload({"decode": WorkloadItem(batch=32, context=4096, mode="graph")})
    plan = planner.plan(spec, gpu_budget=24 * 10**9, workload=workload)
    layers = spec.model.expanded()
    index = {layer.name: layer.index for layer in layers}
    where = {index[lay.name]: {p: "uva" if p in lay.uva else "prefetch" for p in lay.offloaded}
             for lay in plan.layers if lay.offloaded}
    fast = PlacementCost(layers, H200, workload).step_ms(where, plan.summary.prefetch_step or 1)
    assert fast == pytest.approx(plan.predictions.weighted_step_ms, abs=1e-3)
    short = Workload({"decode": WorkloadItem(batch=32, context=1, mode="graph")})
    assert PlacementCost(layers, H200, short).step_ms(where, plan.summary.prefetch_step or 1) < fast


def test_predicting_again_keeps_the_forwards_context():
    """show --hardware predicts the plan's workloads again: with their context, so with the cache read."""
    from planner.cost.predicted import chosen_predictions

    plan = planner.plan(spec_of("llama-3-8b"), gpu_budget=60 * 10**9,
                        workload=Workload({"decode": WorkloadItem(batch=32, context=8192, mode="graph")}))
    again = chosen_predictions(plan, "h200", None)
    assert again.workloads[0].step_ms == plan.predictions.workloads[0].step_ms


def test_layer_shapes_read_once_per_listing_equal_those_read_layer_by_layer():
    """``layer_shapes`` reads a stack of layers listing the same params once and renames the shape for each layer:
    each layer's shape is the one read from that layer alone, and the renaming keeps every other field."""
    import dataclasses

    from planner.memory.shapes import LayerShape, _named, layer_shapes

    spec = load_spec(EXAMPLES / "generated" / "mixtral-8x7b.yaml")
    layers = spec.model.expanded()
    together = layer_shapes(layers, 32, 8)
    assert together == [layer_shapes([layer], 32, 8)[0] for layer in layers]
    assert len({s.name for s in together}) == len(layers)
    full = LayerShape(**{f.name: object() for f in dataclasses.fields(LayerShape)})  # no field at its default
    assert _named(full, "other") == dataclasses.replace(full, name="other")
