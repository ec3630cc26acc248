"""Param kinds from names: the real naming schemes of dense, MoE, fused-expert and quantized checkpoints."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.kinds import PARAM_KINDS, classify, param_kind
from planner.layers import eligible_params
from schemas import SpecFile

BLOCK = "model.layers.7"

# (name relative to the decoder block, kind), per naming scheme
LLAMA = [
    ("self_attn.q_proj.weight", "attention"), ("self_attn.k_proj.weight", "attention"),
    ("self_attn.v_proj.weight", "attention"), ("self_attn.o_proj.weight", "attention"),
    ("self_attn.rotary_emb.inv_freq", "attention"),
    ("mlp.gate_proj.weight", "dense_mlp"), ("mlp.up_proj.weight", "dense_mlp"), ("mlp.down_proj.weight", "dense_mlp"),
    ("input_layernorm.weight", "norm"), ("post_attention_layernorm.weight", "norm"),
]
MIXTRAL = [
    ("block_sparse_moe.gate.weight", "router"),
    ("block_sparse_moe.experts.0.w1.weight", "routed_experts"),
    ("block_sparse_moe.experts.7.w2.weight", "routed_experts"),
    ("block_sparse_moe.experts.3.w3.weight", "routed_experts"),
    ("self_attn.q_proj.weight", "attention"), ("input_layernorm.weight", "norm"),
]
QWEN_MOE = [
    ("mlp.gate.weight", "router"),
    ("mlp.experts.59.gate_proj.weight", "routed_experts"), ("mlp.experts.0.down_proj.weight", "routed_experts"),
    ("mlp.shared_expert.gate_proj.weight", "shared_experts"), ("mlp.shared_expert.down_proj.weight", "shared_experts"),
    ("mlp.shared_expert_gate.weight", "router"),
    ("self_attn.q_proj.bias", "attention"),
    ("self_attn.q_norm.weight", "norm"), ("self_attn.k_norm.weight", "norm"),  # Qwen3
]
DEEPSEEK = [
    ("self_attn.q_proj.weight", "attention"),  # V2-Lite
    ("self_attn.q_a_proj.weight", "attention"), ("self_attn.q_a_layernorm.weight", "norm"),
    ("self_attn.q_b_proj.weight", "attention"), ("self_attn.kv_a_proj_with_mqa.weight", "attention"),
    ("self_attn.kv_a_layernorm.weight", "norm"), ("self_attn.kv_b_proj.weight", "attention"),
    ("self_attn.o_proj.weight", "attention"),
    ("mlp.gate.weight", "router"), ("mlp.gate.e_score_correction_bias", "router"),
    ("mlp.experts.255.gate_proj.weight", "routed_experts"), ("mlp.experts.0.up_proj.weight", "routed_experts"),
    ("mlp.shared_experts.gate_proj.weight", "shared_experts"), ("mlp.shared_experts.down_proj.weight", "shared_experts"),
    ("mlp.gate_proj.weight", "dense_mlp"),  # the first, dense layers
    # V3 fp8: block scales are their own kind, whatever weight they scale
    ("mlp.experts.3.down_proj.weight_scale_inv", "scale"), ("mlp.shared_experts.up_proj.weight_scale_inv", "scale"),
    ("self_attn.kv_b_proj.weight_scale_inv", "scale"),
]
FUSED = [
    ("mlp.experts.gate_up_proj", "routed_experts"), ("mlp.experts.down_proj", "routed_experts"),  # 3-D tensors
    ("mlp.router.weight", "router"), ("mlp.router.bias", "router"),  # gpt-oss
    ("mlp.experts.gate_up_proj_blocks", "routed_experts"), ("mlp.experts.gate_up_proj_bias", "routed_experts"),
    ("mlp.experts.gate_up_proj_scales", "scale"), ("mlp.experts.down_proj_scales", "scale"),
    ("self_attn.sinks", "attention"),
    ("feed_forward.router.weight", "router"), ("feed_forward.experts.gate_up_proj", "routed_experts"),  # Llama-4
    ("feed_forward.shared_expert.down_proj.weight", "shared_experts"), ("feed_forward.gate_proj.weight", "dense_mlp"),
    ("block_sparse_moe.input_linear.weight", "routed_experts"),  # GraniteMoE
    ("block_sparse_moe.router.layer.weight", "router"),
    ("ffn.experts.mlp.w1", "routed_experts"), ("ffn.router.layer.weight", "router"),  # DBRX
    ("mlp.moe_statics.e_score_correction_bias", "router"),  # ERNIE-4.5
]
QUANTIZED = [
    ("self_attn.q_proj.weight_scale", "scale"), ("self_attn.q_proj.input_scale", "scale"),  # compressed-tensors fp8
    ("self_attn.k_scale", "scale"), ("mlp.experts.0.w1.weight_scale_2", "scale"),  # ModelOpt
    ("mlp.experts.0.down_proj.qweight", "routed_experts"), ("mlp.experts.0.down_proj.scales", "scale"),  # GPTQ/AWQ
    ("mlp.experts.0.down_proj.qzeros", "scale"), ("mlp.experts.0.down_proj.g_idx", "scale"),
    ("mlp.down_proj.weight_zero_point", "scale"), ("mlp.down_proj.weight_packed", "dense_mlp"),
    ("mlp.down_proj.weight.absmax", "scale"), ("mlp.down_proj.weight.quant_map", "scale"),  # bitsandbytes
    ("mlp.down_proj.weight.quant_state.bitsandbytes__nf4", "scale"), ("mlp.down_proj.weight.SCB", "scale"),
]
GPT2 = [("attn.c_attn.weight", "attention"), ("attn.c_proj.weight", "attention"), ("mlp.c_fc.weight", "dense_mlp"),
        ("mlp.c_proj.bias", "dense_mlp"), ("ln_1.weight", "norm"), ("ln_2.bias", "norm")]
OTHER = [("mixer.A_log", "other"), ("weight", "other"), ("mixer.in_proj.weight", "other")]

TABLE = LLAMA + MIXTRAL + QWEN_MOE + DEEPSEEK + FUSED + QUANTIZED + GPT2 + OTHER


@pytest.mark.parametrize(("name", "kind"), TABLE)
def test_kind_of_block_params(name, kind):
    assert param_kind(BLOCK, name) == kind


@pytest.mark.parametrize(("layer", "name", "kind"), [
    ("model.embed_tokens", "weight", "embedding"), ("lm_head", "weight", "embedding"),
    ("model.norm", "weight", "norm"), ("transformer.wte", "weight", "embedding"), ("transformer.ln_f", "bias", "norm"),
    ("gpt_neox.embed_in", "weight", "embedding"), ("embed_out", "weight", "embedding"),
    # a spec cut into finer layers classifies like one with whole blocks
    ("model.layers.3.mlp", "experts.0.w1.weight", "routed_experts"), ("model.layers.3.mlp", "gate.weight", "router"),
    ("model.layers.3.mlp", "shared_experts.up_proj.weight", "shared_experts"),
    ("model.layers.3.self_attn", "kv_b_proj.weight", "attention"),
])
def test_kind_uses_the_layer_name_too(layer, name, kind):
    assert param_kind(layer, name) == kind


def test_kinds_table_covers_every_kind_but_explicit_ones():
    assert {k for _, k in TABLE} | {"embedding"} == set(PARAM_KINDS)


@given(st.sampled_from(TABLE), st.integers(0, 10**4), st.sampled_from(["model.layers", "transformer.h", "blocks"]))
def test_layer_numbers_prefix_and_case_do_not_matter(entry, number, prefix):
    name, kind = entry
    assert param_kind(f"{prefix}.{number}", name) == kind
    assert classify(f"{prefix}.{number}.{name}".upper()) == kind
    renumbered = ".".join(str(number) if s.isdigit() else s for s in name.split("."))
    assert param_kind(BLOCK, renumbered) == kind


NORMS = ["input_layernorm", "post_attention_layernorm", "norm", "q_norm", "ln_2", "LayerNorm", "pre_feedforward_layernorm"]


@given(st.sampled_from(NORMS), st.sampled_from(["mlp.experts.3", "block_sparse_moe.experts.0", "mlp.shared_experts",
                                                "mlp.gate", "self_attn", "mlp.experts"]),
       st.sampled_from(["weight", "bias", "scale"]))
def test_norms_are_never_routed_experts(norm, where, leaf):
    assert param_kind(BLOCK, f"{where}.{norm}.{leaf}") == "norm"


@pytest.mark.parametrize("name", [n for n, k in TABLE if k == "routed_experts"])
def test_scales_of_routed_experts_are_not_routed_experts(name):
    for suffix in ("weight_scale_inv", "weight_scale", "input_scale", "scales", "qzeros", "g_idx"):
        scale = name.rsplit(".", 1)[0] + "." + suffix
        assert param_kind(BLOCK, scale) == "scale"


def test_explicit_kind_overrides_the_name():
    assert param_kind(BLOCK, "mlp.gate.weight", "routed_experts") == "routed_experts"
    spec = SpecFile.model_validate({"model": {"name": "t", "dtype": "bf16", "layers": [{"name": "b.0", "params": {
        "blob": {"shape": [4], "kind": "routed_experts"},
        "mlp.experts.0.w1": [4],
        "mlp.experts.0.w1_scale": {"shape": [1], "dtype": "float32"},
        "mlp.shared_expert.w1": [4],
        "mlp.gate.weight": {"shape": [2], "kind": "attention"},
    }}]}})
    layer = spec.model.expanded()[0]
    names = lambda ts: [t.name for t in ts]  # noqa: E731
    assert names(eligible_params(layer, None, set(), ["routed_experts"])) == ["blob", "mlp.experts.0.w1"]
    assert names(eligible_params(layer, None, set(), ["attention", "scale"])) == ["mlp.experts.0.w1_scale",
                                                                                   "mlp.gate.weight"]
    # kinds and segments: both must match
    assert names(eligible_params(layer, ["experts"], set(), ["routed_experts", "shared_experts"])) == [
        "mlp.experts.0.w1"]
    assert names(eligible_params(layer, ["w1"], set(), ["routed_experts", "shared_experts"])) == [
        "mlp.experts.0.w1", "mlp.shared_expert.w1"]
    # and a spec with kinds round-trips
    assert SpecFile.model_validate(spec.model_dump(mode="json")) == spec
