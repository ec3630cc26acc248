"""The structural fields of a Hugging Face ``config.json``, checked before a model is built.

transformers reports a bad config late and in its own words (a ZeroDivisionError for
``num_attention_heads: 0``, a KeyError for an unknown activation, a 3-layer model for
``num_hidden_layers: -1``). Here the fields that size the model are checked first, every
problem naming the config file and the field, with close matches for a misspelled name.
The names transformers knows (model types, activations, RoPE types) are passed in, so the
checks themselves need neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.errors import Problem, suggest

# ints that size the model: > 0 when present (null means "absent" in many configs)
POSITIVE = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "head_dim", "num_experts", "num_local_experts",
    "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok", "max_position_embeddings",
    "shared_expert_intermediate_size", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim", "n_group", "topk_group", "decoder_sparse_step",
    "moe_layer_freq", "d_model", "n_embd", "n_head", "n_layer", "n_inner", "n_positions",
    "num_layers", "ffn_dim", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
)
# ints that may be 0
NON_NEGATIVE = ("first_k_dense_replace", "n_shared_experts", "num_shared_experts",
                "num_nextn_predict_layers")
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")
DTYPE_FIELDS = ("torch_dtype", "dtype")
BUILD_DTYPES = ("float16", "bfloat16", "float32", "float64")  # floating types with storage
ACT_FIELDS = ("hidden_act", "hidden_activation", "activation_function")
ROPE_FIELDS = ("rope_scaling", "rope_parameters")

MAX_PARAMS = 10**13  # the largest published models have about 2 * 10**12
MAX_LAYERS = 10_000  # building is linear in layers; no published model has 1,000


@dataclass(frozen=True)
class Known:
    """The names the installed transformers knows."""

    version: str
    model_types: Iterable[str]
    activations: Iterable[str]
    rope_types: Iterable[str]


def _is_int(value: Any) -> bool:
    return type(value) is int


def _ints(data: Mapping[str, Any], field: str, source: str, prefix: str) -> list[Problem]:
    out = []
    for names, low, word in ((POSITIVE, 1, "a positive whole number"),
                             (NON_NEGATIVE, 0, "a whole number >= 0")):
        for name in names:
            value = data.get(name)
            if value is None:
                continue
            if not _is_int(value) or value < low:
                out.append(Problem(f"expected {word}, got {value!r:.60}", source, field=prefix + name))
    return out


def _divisibility(data: Mapping[str, Any], source: str, prefix: str) -> list[Problem]:
    get = {k: data.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                     "num_experts_per_tok", "head_dim", *EXPERTS)}
    ok = {k: v for k, v in get.items() if _is_int(v) and v > 0}
    out = []
    h, heads, kv = ok.get("hidden_size"), ok.get("num_attention_heads"), ok.get("num_key_value_heads")
    if h and heads and get["head_dim"] is None and h % heads:
        out.append(Problem(f"{h} is not a multiple of num_attention_heads {heads} (and head_dim is "
                           "not given)", source, field=prefix + "hidden_size"))
    if heads and kv and heads % kv:
        out.append(Problem(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                           source, field=prefix + "num_key_value_heads"))
    experts = next((ok[k] for k in EXPERTS if k in ok), None)
    per_token = ok.get("num_experts_per_tok")
    if experts and per_token and per_token > experts:
        out.append(Problem(f"{per_token} experts per token but only {experts} experts", source,
                           field=prefix + "num_experts_per_tok"))
    return out


def _names(data: Mapping[str, Any], source: str, prefix: str, known: Known) -> list[Problem]:
    out = []
    for name in DTYPE_FIELDS:
        value = data.get(name)
        if value is not None and value not in BUILD_DTYPES:
            hint = suggest(str(value).removeprefix("torch."), BUILD_DTYPES)
            out.append(Problem(f"{value!r:.60} is not a dtype a model is built in{hint} "
                               f"(expected one of {', '.join(BUILD_DTYPES)})", source, field=prefix + name))
    acts = list(known.activations)
    for name in ACT_FIELDS:
        value = data.get(name)
        if isinstance(value, str) and value not in acts:
            out.append(Problem(f"activation {value!r:.60} is not known to transformers {known.version}"
                               f"{suggest(value, acts, n=3)}", source, field=prefix + name))
    for name in ROPE_FIELDS:
        out += _rope(data.get(name), source, prefix + name, list(known.rope_types), known.version)
    return out


def _rope(value: Any, source: str, field: str, kinds: list[str], version: str) -> list[Problem]:
    if value is None:
        return []
    if not isinstance(value, dict):
        return [Problem(f"expected a mapping such as {{\"rope_type\": \"linear\", \"factor\": 2.0}} or "
                        f"null, got {value!r:.60}", source, field=field)]
    if value and all(isinstance(v, dict) for v in value.values()):  # per attention type
        return [p for key, v in value.items() for p in _rope(v, source, f"{field}.{key}", kinds, version)]
    key = "rope_type" if "rope_type" in value else "type"
    kind = value.get(key)
    if kind is None or kind in kinds:
        return []
    return [Problem(f"RoPE type {kind!r:.60} is not known to transformers {version}"
                    f"{suggest(str(kind), kinds, n=3)} (known: {', '.join(kinds)})", source,
                    field=f"{field}.{key}")]


def config_problems(data: Mapping[str, Any], source: str, known: Known, prefix: str = "") -> list[Problem]:
    """Every structural problem of a config dict (sub-configs such as ``text_config`` included)."""
    out: list[Problem] = []
    if not prefix:
        model_type = data["model_type"]
        types = list(known.model_types)
        if model_type not in types:
            hint = suggest(model_type, types, n=3) or "; a newer transformers may have it"
            out.append(Problem(f"model_type '{model_type:.60}' is not known to the installed transformers "
                               f"{known.version}{hint}", source))
    out += _ints(data, "", source, prefix)
    out += _divisibility(data, source, prefix)
    out += _names(data, source, prefix, known)
    for key, value in data.items():
        if key.endswith("_config") and isinstance(value, dict):
            out += config_problems(value, source, known, f"{prefix}{key}.")
    return out


def _first_int(values: Mapping[str, Any], *names: str) -> int:
    for name in names:
        if _is_int(values.get(name)) and values[name] > 0:
            return values[name]
    return 0


def estimated_params(values: Mapping[str, Any]) -> int:
    """About the parameter count a (text) config describes, from its sizing fields (norms left out)."""
    h = _first_int(values, "hidden_size", "d_model", "n_embd")
    layers = _first_int(values, "num_hidden_layers", "num_layers", "n_layer")
    vocab = _first_int(values, "vocab_size")
    inter = _first_int(values, "intermediate_size", "ffn_dim", "n_inner") or 4 * h
    experts = _first_int(values, *EXPERTS)
    expert_inter = _first_int(values, "moe_intermediate_size") or inter
    heads = _first_int(values, "num_attention_heads", "n_head") or 1
    kv = _first_int(values, "num_key_value_heads") or heads
    head_dim = _first_int(values, "head_dim") or max(h // heads, 1)
    attention = h * head_dim * 2 * (heads + kv)
    mlp = 3 * h * inter + 3 * h * expert_inter * experts
    return layers * (attention + mlp) + 2 * vocab * h


def size_problems(values: Mapping[str, Any], source: str) -> list[Problem]:
    """The model a config describes is refused when it is too large to be a real one."""
    out = []
    layers = _first_int(values, "num_hidden_layers", "num_layers", "n_layer")
    if layers > MAX_LAYERS:
        out.append(Problem(f"{layers:,} layers is more than {MAX_LAYERS:,}; refused as a bogus config "
                           "(building it would take very long)", source, field="num_hidden_layers"))
    params = estimated_params(values)
    if params > MAX_PARAMS:
        sizes = ", ".join(f"{k} {values[k]:,}" for k in ("hidden_size", "intermediate_size", "vocab_size",
                                                          "num_hidden_layers", *EXPERTS)
                          if _is_int(values.get(k)))
        out.append(Problem(f"the config describes about {params:.2g} parameters ({sizes}), more than "
                           f"{MAX_PARAMS:.0e}; refused as a bogus config", source))
    return out
