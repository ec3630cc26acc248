"""param_kind classifies a layer's param as classify does its full name (it normalizes the two parts apart)."""

from hypothesis import given
from hypothesis import strategies as st

from schemas.kinds import classify, param_kind

segment = st.sampled_from(["model", "layers", "0", "17", "mlp", "experts", "3", "w1", "weight", "self_attn", "q_proj",
                           "shared_expert", "gate", "input_layernorm", "Block_Sparse_MoE", "embed_tokens", "scale",
                           "", "lm_head", "ln_f", "quant_state", "bias"])
dotted = st.lists(segment, min_size=1, max_size=5).map(".".join)


@given(dotted, dotted)
def test_param_kind_is_classify_of_the_full_name(layer, name):
    assert param_kind(layer, name) == classify(f"{layer}.{name}")
    assert param_kind(layer, name, "router") == "router"
