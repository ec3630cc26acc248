"""The bridge to vLLM's offload flags: `plan --from-vllm` follows vLLM's rules, `export --to vllm` round-trips.

vLLM's rules, as read in vLLM's source (the expected values below are worked out by hand from them):

- prefetch (vllm/model_executor/offloader/prefetch.py): decoder layer i is a candidate iff
  i % G >= G - K (the last K of each group of G); of a candidate, every param, or with
  --offload-params those whose name holds a listed segment as whole dotted segments; a candidate
  with no match is skipped; the j-th offloaded layer uses slot j % S.
- UVA (vllm/model_executor/offloader/uva.py): params in layer order, each layer's in vLLM's order,
  offloaded whole while the bytes so far are below int(gb * 1024**3); only decoder layers.
- vLLM's params (vllm/model_executor/models/*.py): q/k/v fused into qkv_proj, gate/up into
  gate_up_proj, routed experts into experts.w13_weight and experts.w2_weight; in an MoE block the
  router first, then the shared experts, then the routed experts.
- flags (vllm/config/offload.py): --offload-prefetch-step defaults to 1; auto takes prefetch when
  --offload-group-size > 0 even with --cpu-offload-gb set.
"""

from __future__ import annotations

import json

import pytest
from cli_samples import invoke
from conftest import EXAMPLES

import planner
from planner.vllm.export import export, segments_for
from planner.vllm.flags import gib_text
from planner.vllm.flags import parse_vllm_flags
from planner.vllm.plan import from_vllm
from schemas import load_spec
from schemas.errors import InputError
from schemas.plan import Plan

LLAMA = EXAMPLES / "llama-3-8b.yaml"
MIXTRAL = EXAMPLES / "mixtral-8x7b.yaml"  # checkpoint names: block_sparse_moe.experts.<e>.w1/w2/w3
DEEPSEEK = EXAMPLES / "generated" / "deepseek-v2-lite.yaml"  # transformers 5: experts.gate_up_proj, first layer dense

MiB = 2**20


def plan_of(path, flags: str, **kw) -> Plan:
    return from_vllm(load_spec(path), parse_vllm_flags(flags), **kw)


def offloaded(plan: Plan) -> dict[str, list[str]]:
    return {layer.name: sorted(layer.offloaded) for layer in plan.layers if layer.offloaded}


def placement(plan: Plan) -> tuple:
    """What vLLM executes: params per layer and their backend, slots and copy points, step."""
    return (plan.summary.backend, plan.summary.prefetch_step,
            [(layer.name, layer.offloaded, layer.uva, layer.prefetch) for layer in plan.layers])


LLAMA_ALL = sorted(["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                    "input_layernorm.weight", "post_attention_layernorm.weight"])


# --- the group rule ------------------------------------------------------------------------


def test_group_rule_takes_the_last_k_of_each_group_with_one_slot_by_default() -> None:
    plan = plan_of(LLAMA, "--offload-group-size 8 --offload-num-in-group 2")
    # vLLM's own example: group_size=8, num_in_group=2 offloads layers 6,7,14,15,22,23,...
    assert list(offloaded(plan)) == [f"model.layers.{i}" for i in (6, 7, 14, 15, 22, 23, 30, 31)]
    assert all(v == LLAMA_ALL for v in offloaded(plan).values())  # no --offload-params: every param
    assert plan.summary.prefetch_step == 1  # vLLM's default step, not this planner's 2
    assert {layer.prefetch.slot for layer in plan.layers if layer.prefetch} == {0}
    assert plan.summary.strategy == "group" and plan.summary.notes[0].startswith("from vLLM flags:")


def test_slots_go_round_in_offload_order() -> None:
    plan = plan_of(LLAMA, "--offload-group-size=4 --offload-num-in-group=1 --offload-prefetch-step=3")
    slots = [(layer.name, layer.prefetch.slot) for layer in plan.layers if layer.prefetch]
    # layers 3, 7, 11, ... 31 (8 layers), slot j % 3
    assert slots == [(f"model.layers.{4 * j + 3}", j % 3) for j in range(8)]
    assert any("8 offloaded layers in 3 slots" in n for n in plan.summary.notes)  # vLLM's wrap hazard, named


def test_deepseek_group_rule_counts_the_dense_first_layer() -> None:
    # 27 decoder layers, stack index = layer number; G=8, K=2 -> 6, 7, 14, 15, 22, 23
    plan = plan_of(DEEPSEEK, "--offload-group-size 8 --offload-num-in-group 2 --offload-params shared_experts")
    assert offloaded(plan) == {f"model.layers.{i}": ["mlp.shared_experts.down_proj.weight",
                                                      "mlp.shared_experts.gate_proj.weight",
                                                      "mlp.shared_experts.up_proj.weight"]
                               for i in (6, 7, 14, 15, 22, 23)}


# --- --offload-params matching (whole dotted segments, against vLLM's names) ---------------


@pytest.mark.parametrize(("flags", "layer3"), [
    # vLLM's fused MoE param w13_weight holds every expert's w1 and w3
    ("--offload-params w13_weight", sorted(f"block_sparse_moe.experts.{e}.{w}.weight" for e in range(8)
                                           for w in ("w1", "w3"))),
    ("--offload-params experts.w2_weight", sorted(f"block_sparse_moe.experts.{e}.w2.weight" for e in range(8))),
    # 'experts' is a segment of both fused expert params, not of the router
    ("--offload-params experts", sorted(f"block_sparse_moe.experts.{e}.{w}.weight" for e in range(8)
                                        for w in ("w1", "w2", "w3"))),
    ("--offload-params block_sparse_moe.gate", ["block_sparse_moe.gate.weight"]),
    ("--offload-params qkv_proj o_proj", sorted(f"self_attn.{p}_proj.weight" for p in "qkvo")),
])
def test_offload_params_match_vllm_names_on_mixtral(flags: str, layer3: list[str]) -> None:
    plan = plan_of(MIXTRAL, f"--offload-group-size 4 --offload-num-in-group 1 {flags}")
    assert list(offloaded(plan)) == [f"model.layers.{i}" for i in range(3, 32, 4)]
    assert offloaded(plan)["model.layers.3"] == layer3


@pytest.mark.parametrize("segment", ["expert", "w1", "q_proj", "block_sparse_moe.experts.0"])
def test_a_part_of_a_segment_or_a_fused_away_name_matches_nothing(segment: str) -> None:
    # 'expert' is not a whole segment; w1 and q_proj do not exist in vLLM (fused); vLLM skips every layer
    plan = plan_of(MIXTRAL, f"--offload-group-size 4 --offload-params {segment}")
    assert plan.summary.backend == "none" and not offloaded(plan)
    assert any("vLLM skips" in n for n in plan.summary.notes)


def test_gate_up_proj_is_not_the_routed_experts_in_vllm() -> None:
    # transformers 5 names the routed experts mlp.experts.gate_up_proj, vLLM mlp.experts.w13_weight
    plan = plan_of(DEEPSEEK, "--offload-group-size 1 --offload-params gate_up_proj")
    assert offloaded(plan)["model.layers.0"] == ["mlp.gate_proj.weight", "mlp.up_proj.weight"]  # dense MLP
    assert offloaded(plan)["model.layers.5"] == ["mlp.shared_experts.gate_proj.weight",
                                                 "mlp.shared_experts.up_proj.weight"]


# --- --cpu-offload-gb: whole params in vLLM's order until the GiB are reached ----------------


def test_cpu_offload_gb_takes_params_in_order_the_crossing_one_whole() -> None:
    # a Llama-3-8B layer: qkv 48 MiB, o 32, gate_up 224, down 112, two norms of 8 KiB: 416.02 MiB.
    # 1 GiB = 1024 MiB: layers 0, 1 (832.03), then layer 2's qkv (880.03), o (912.03), gate_up (1136.03,
    # crosses: still offloaded), then the limit is reached: down and the norms stay.
    plan = plan_of(LLAMA, "--cpu-offload-gb 1")
    assert offloaded(plan) == {"model.layers.0": LLAMA_ALL, "model.layers.1": LLAMA_ALL,
                               "model.layers.2": sorted(["self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                         "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                                         "mlp.gate_proj.weight", "mlp.up_proj.weight"])}
    assert plan.summary.backend == "uva" and plan.summary.buffer_bytes == 0
    assert plan.summary.offloaded_bytes == 2 * 416 * MiB + 2 * 2 * 4096 * 2 + 304 * MiB


def test_cpu_offload_params_with_fused_experts_on_mixtral() -> None:
    # experts only: per layer w13 = 16 x 112 MiB = 1792 MiB, then w2 = 8 x 112 MiB.
    # 1 GiB: layer 0's w13 crosses 1024 MiB and is offloaded whole; w2 is not.
    plan = plan_of(MIXTRAL, "--cpu-offload-gb 1 --cpu-offload-params experts")
    assert offloaded(plan) == {"model.layers.0": sorted(f"block_sparse_moe.experts.{e}.{w}.weight"
                                                        for e in range(8) for w in ("w1", "w3"))}
    # 2 GiB: w13 (1792) and w2 (2688, crossing) of layer 0; layer 1 nothing
    plan = plan_of(MIXTRAL, "--cpu-offload-gb 2 --cpu-offload-params experts")
    assert list(offloaded(plan)) == ["model.layers.0"] and len(offloaded(plan)["model.layers.0"]) == 24


def test_cpu_offload_gb_follows_vllms_order_in_deepseeks_moe_block() -> None:
    # layer 0 (dense): q 12, kv_a 2.25, kv_b 4, o 8, gate_up 85.5, down 42.75 MiB + norms (5 KiB): 154.50 MiB.
    # 0.2 GiB = 204.8 MiB. Layer 1 in vLLM's order: attention 26.25 MiB (-> 180.76), router 0.5 (-> 181.26),
    # shared gate_up 22 (-> 203.26), shared down 11 (-> 214.26, crosses): stop. The spec lists the routed
    # experts (704 MiB) first; vLLM registers them after the shared experts, so they stay.
    plan = plan_of(DEEPSEEK, "--cpu-offload-gb 0.2")
    assert list(offloaded(plan)) == ["model.layers.0", "model.layers.1"]
    assert offloaded(plan)["model.layers.1"] == sorted([
        "self_attn.q_proj.weight", "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
        "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight", "mlp.gate.weight",
        "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight",
        "mlp.shared_experts.down_proj.weight"])


def test_cpu_offload_gb_never_reaches_the_embedding() -> None:
    plan = plan_of(LLAMA, "--cpu-offload-gb 100")
    assert "model.embed_tokens" not in offloaded(plan) and "lm_head" not in offloaded(plan)
    assert len(offloaded(plan)) == 32
    assert any("not reached" in n for n in plan.summary.notes)


def test_both_backends_given_auto_takes_prefetch_and_an_explicit_backend_wins() -> None:
    both = "--cpu-offload-gb 4 --offload-group-size 4"
    assert plan_of(LLAMA, both).summary.backend == "prefetch"
    assert plan_of(LLAMA, both + " --offload-backend uva").summary.backend == "uva"
    assert plan_of(LLAMA, "--offload-group-size 4 --offload-backend uva").summary.backend == "none"


# --- parsing -------------------------------------------------------------------------------


def test_flag_spellings_as_vllms_parser_reads_them() -> None:
    a = parse_vllm_flags("--offload-group-size 8 --offload-num-in-group 2 --offload-params mlp self_attn")
    b = parse_vllm_flags("--offload_group_size=8 --offload-num-in-group=2 --offload-params mlp self_attn")
    assert a == b and a.offload_params == ("mlp", "self_attn")
    assert parse_vllm_flags("--cpu-offload-gb .5").uva_max_bytes == 2**29


@pytest.mark.parametrize(("flags", "fragment"), [
    ("--cpu-offload-gb 4GB", "write 4"), ("--offload-group-size 8 --offload-group-size 8", "given twice"),
    ("--offload-params mlp,self_attn", "not commas"), ("--offload-grp 8", "did you mean '--offload-group-size'"),
])
def test_bad_flags_name_the_flag(flags: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        parse_vllm_flags(flags)


# --- export --to vllm ------------------------------------------------------------------------


ROUND_TRIP = [
    (LLAMA, "--offload-group-size 8 --offload-num-in-group 2"),
    (LLAMA, "--offload-group-size 4 --offload-prefetch-step 2 --offload-params mlp"),
    (LLAMA, "--offload-group-size 3 --offload-num-in-group 2 --offload-prefetch-step 3 --offload-params down_proj o_proj"),
    (LLAMA, "--offload-group-size 1 --offload-prefetch-step 2 --offload-params gate_up_proj"),
    (LLAMA, "--cpu-offload-gb 1"),
    (LLAMA, "--cpu-offload-gb 4.3"),
    (LLAMA, "--cpu-offload-gb 2 --cpu-offload-params mlp"),
    (LLAMA, "--cpu-offload-gb 0.01"),
    (MIXTRAL, "--offload-group-size 2 --offload-params experts"),
    (MIXTRAL, "--offload-group-size 4 --offload-num-in-group 3 --offload-params w13_weight self_attn"),
    (MIXTRAL, "--cpu-offload-gb 20 --cpu-offload-params experts.w2_weight"),
    (MIXTRAL, "--cpu-offload-gb 3"),
    (DEEPSEEK, "--offload-group-size 8 --offload-num-in-group 2 --offload-params experts"),
    (DEEPSEEK, "--offload-group-size 2 --offload-prefetch-step 2"),
    (DEEPSEEK, "--cpu-offload-gb 0.2"),
    (DEEPSEEK, "--cpu-offload-gb 5 --cpu-offload-params shared_experts"),
    (LLAMA, ""),
]


@pytest.mark.parametrize(("path", "flags"), ROUND_TRIP, ids=[f"{p.stem}:{f}" for p, f in ROUND_TRIP])
def test_export_round_trips_plans_made_from_vllm_flags(path, flags: str) -> None:
    plan = plan_of(path, flags)
    result = export(plan)
    assert result.flags is not None and not result.problems
    again = plan_of(path, result.flags.text())
    assert placement(again) == placement(plan)


@pytest.mark.parametrize(("kw", "expressible"), [
    ({"strategy": "group", "group_size": 4, "num_in_group": 1, "backend": "prefetch"}, True),
    ({"strategy": "group", "group_size": 5, "num_in_group": 2, "prefetch_step": 3, "params": ["self_attn", "mlp"],
      "backend": "prefetch"}, True),
    # a group plan on UVA leaves layers 0, 2, ... on the GPU: vLLM's UVA takes params in layer order
    ({"strategy": "group", "group_size": 2, "num_in_group": 1, "backend": "uva", "params": ["mlp"]}, False),
])
def test_export_of_this_planners_group_plans(kw: dict, expressible: bool) -> None:
    spec = load_spec(LLAMA)
    plan = planner.plan(spec, gpu_budget=10**12, **kw)
    result = export(plan)
    if not expressible:
        assert result.flags is None and result.problems[0].part == "a budget spread"
        return
    assert result.flags is not None
    assert placement(from_vllm(spec, result.flags)) == placement(plan)


@pytest.mark.parametrize(("path", "budget", "part"), [
    (LLAMA, "12GB", "a budget spread"),
    (EXAMPLES / "generated" / "qwen3-30b-a3b.yaml", "24GB", "an offloaded embedding"),
])
def test_export_explains_an_inexpressible_plan_with_the_closest(tmp_path, path, budget: str, part: str) -> None:
    out = tmp_path / "p.yaml"
    assert invoke("plan", str(path), "--gpu-budget", budget, "--strategy", "auto" if "qwen" in path.name else "budget",
                  "-o", str(out)).exit_code == 0
    result = invoke("export", str(out), "--to", "vllm", "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert not data["expressible"] and data["problems"][0]["part"] == part
    closest = data["closest"]
    assert closest["fits"] and closest["peak_gpu_bytes"] <= closest["target_gpu_bytes"]
    # the closest plan is what --from-vllm makes of its flags, and it is expressible itself
    again = plan_of(path, closest["command_line"])
    assert again.summary.peak_gpu_bytes == closest["peak_gpu_bytes"]
    assert export(again).flags is not None


def test_export_of_a_mixed_plan_says_so() -> None:
    spec = load_spec(EXAMPLES / "generated" / "qwen3-30b-a3b.yaml")
    plan = planner.plan(spec, gpu_budget=40 * 10**9, strategy="budget", backends={"routed_experts": "uva"},
                        backend="prefetch")
    result = export(plan)
    assert plan.summary.backend == "mixed" and result.flags is None
    assert "a mixed backend" in [p.part for p in result.problems]


def test_export_refuses_a_split_fused_param() -> None:
    plan = planner.plan(load_spec(LLAMA), gpu_budget=10**12, strategy="group", group_size=4, params=["q_proj"],
                        backend="prefetch")
    result = export(plan)
    assert result.flags is None and result.problems[0].part == "a split fused param"
    assert "qkv_proj" in result.problems[0].detail


def test_cli_plan_from_vllm_then_diff_with_auto_and_export(tmp_path) -> None:
    v, a = tmp_path / "v.yaml", tmp_path / "a.yaml"
    flags = "--offload-group-size 8 --offload-num-in-group 2 --offload-prefetch-step 1"
    assert invoke("plan", str(LLAMA), "--gpu-budget", "16GB", "--from-vllm", flags, "-o", str(v)).exit_code == 0
    assert invoke("plan", str(LLAMA), "--gpu-budget", "16GB", "--strategy", "auto", "-o", str(a)).exit_code == 0
    diff = invoke("diff", str(v), str(a))
    assert diff.exit_code == 1 and "predicted step" in diff.output
    exported = invoke("export", str(v), "--to", "vllm")
    assert exported.exit_code == 0 and exported.output.strip() == flags
    check = invoke("plan", str(LLAMA), "--gpu-budget", "16GB", "--from-vllm", flags, "--check", str(v))
    assert check.exit_code == 0


def test_gib_text_is_the_shortest_decimal_in_range() -> None:
    assert gib_text(0, 2**30) == "1"
    assert gib_text(2**30, 2**31) == "2"
    low, high = 3 * 2**30 + 5, 3 * 2**30 + 2**20
    x = gib_text(low, high)
    assert low < int(float(x) * 2**30) <= high


def test_segments_for_prefers_short_common_segments() -> None:
    names = ["mlp.gate_up_proj.weight", "mlp.down_proj.weight"]
    assert segments_for(names, ["self_attn.qkv_proj.weight"]) == ("mlp",)
    assert segments_for(names, []) == ()
    assert segments_for(["a.b"], ["x.a.b"]) is None  # every run of a.b is inside a forbidden name
