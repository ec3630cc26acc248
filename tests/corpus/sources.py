"""Bad spec sources: `planner spec --from-hf-config` configs and `--from-safetensors` checkpoints.

Each case is exit 2 with a message naming the file and the field (or tensor) that is wrong.
The configs are the committed Llama 3.2 1B config shrunk to a few small layers, then broken
in one way each; the checkpoints are written byte by byte from the documented layout.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from corpus.case import CliCase

ROOT = Path(__file__).resolve().parents[2]
LLAMA = json.loads((ROOT / "examples" / "configs" / "llama-3.2-1b" / "config.json").read_text())
SMALL = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2}


def config(**changes: Any) -> str:
    """The small Llama config with ``changes`` (a value of ``...`` removes the key)."""
    data = {**LLAMA, **SMALL}
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    return json.dumps(data, indent=2)


def hf(case_id: str, text: str, *expect: str) -> CliCase:
    return CliCase(case_id, ("spec", "--from-hf-config", "{d}/config.json"), {"config.json": text},
                   expect=("config.json", *expect))


def safetensors(header: dict[str, Any] | bytes, data: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def t(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def st(case_id: str, header: dict[str, Any] | bytes, data: bytes, *expect: str) -> CliCase:
    return CliCase(case_id, ("spec", "--from-safetensors", "{d}/m.safetensors"),
                   {"m.safetensors": safetensors(header, data)}, expect=("m.safetensors", *expect))


GOOD_A = {"a.0.w": t("F32", [2], 0, 8)}
GOOD_B = {"a.1.w": t("F32", [2], 0, 8)}
INDEX = "model.safetensors.index.json"


def sharded(case_id: str, weight_map: Any, *expect: str, extra: dict[str, bytes] | None = None,
            index_text: str | None = None) -> CliCase:
    files: dict[str, str | bytes] = {
        "ckpt/a.safetensors": safetensors(GOOD_A, bytes(8)),
        "ckpt/b.safetensors": safetensors(GOOD_B, bytes(8)),
        f"ckpt/{INDEX}": index_text if index_text is not None else json.dumps({"weight_map": weight_map}),
    }
    files.update({f"ckpt/{k}": v for k, v in (extra or {}).items()})
    return CliCase(case_id, ("spec", "--from-safetensors", "{d}/ckpt"), files, expect=expect)


CASES = [
    # --from-hf-config: the ints that size the model
    hf("hf-hidden-size-word", config(hidden_size="abc"), "hidden_size", "positive whole number", "'abc'"),
    hf("hf-hidden-size-fraction", config(hidden_size=4096.5), "hidden_size", "4096.5"),
    hf("hf-zero-heads", config(num_attention_heads=0), "num_attention_heads", "got 0"),
    hf("hf-negative-layers", config(num_hidden_layers=-1), "num_hidden_layers", "got -1"),
    hf("hf-layers-as-bool", config(num_hidden_layers=True), "num_hidden_layers", "got True"),
    hf("hf-vocab-as-string-number", config(vocab_size="32000"), "vocab_size", "'32000'"),
    hf("hf-negative-kv-heads", config(num_key_value_heads=-8), "num_key_value_heads", "got -8"),
    hf("hf-head-dim-zero", config(head_dim=0), "head_dim", "got 0"),
    hf("hf-indivisible-hidden", config(hidden_size=66, head_dim=...), "hidden_size",
       "not a multiple of num_attention_heads 4"),
    hf("hf-indivisible-kv-heads", config(num_key_value_heads=3), "num_key_value_heads",
       "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    hf("hf-moe-more-per-token-than-experts", config(model_type="mixtral", num_local_experts=4,
                                                    num_experts_per_tok=8), "num_experts_per_tok", "only 4 experts"),
    hf("hf-moe-zero-experts", config(model_type="qwen3_moe", num_experts=0), "num_experts", "got 0"),
    hf("hf-moe-intermediate-float", config(model_type="qwen3_moe", moe_intermediate_size=76.8),
       "moe_intermediate_size", "76.8"),
    hf("hf-sub-config-field", config(text_config={"hidden_size": -5}), "text_config.hidden_size", "got -5"),
    # --from-hf-config: names with close matches, never the whole list
    hf("hf-unknown-model-type", config(model_type="lamma"), "model_type 'lamma' is not known",
       "did you mean", "'llama'"),
    hf("hf-dtype-typo", config(torch_dtype="float3"), "torch_dtype", "did you mean 'float32'?"),
    hf("hf-dtype-not-floating", config(torch_dtype="int8"), "torch_dtype", "'int8'", "bfloat16"),
    hf("hf-new-dtype-key", config(torch_dtype=..., dtype="bf16"), "dtype", "'bf16'"),
    hf("hf-activation-typo", config(hidden_act="sillu"), "hidden_act", "'sillu'", "did you mean", "'silu'"),
    hf("hf-rope-unknown-type", config(rope_scaling={"rope_type": "bogus", "factor": 2.0}),
       "rope_scaling.rope_type", "'bogus'", "llama3"),
    hf("hf-rope-legacy-type-typo", config(rope_scaling={"type": "linaer", "factor": 2.0}),
       "rope_scaling.type", "did you mean 'linear'?"),
    hf("hf-rope-not-a-mapping", config(rope_scaling="yes"), "rope_scaling", "expected a mapping"),
    # --from-hf-config: what only transformers finds, as one line naming file and model_type
    hf("hf-rope-missing-factor", config(rope_scaling={"rope_type": "linear"}),
       "cannot build model_type 'llama'", "factor"),
    hf("hf-eps-word", config(rms_norm_eps="tiny"), "cannot build model_type 'llama'", "rms_norm_eps"),
    # --from-hf-config: sizes no real model has
    hf("hf-huge-vocab", config(vocab_size=10**12, hidden_size=16384, head_dim=128), "about",
       "parameters", "vocab_size 1,000,000,000,000", "refused"),
    hf("hf-too-deep", config(num_hidden_layers=10**7), "num_hidden_layers", "10,000,000 layers"),
    # --from-hf-config: the file itself
    hf("hf-duplicate-key", '{"model_type": "llama", "hidden_size": 64, "hidden_size": 128}',
       "'hidden_size' twice"),
    hf("hf-nan", config().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN'), "NaN"),
    hf("hf-empty-model-type", config(model_type=""), "model_type: missing"),
    # --from-safetensors: one file's header
    st("st-overlap", {"a.0.w": t("F32", [2], 0, 8), "a.0.v": t("F32", [1], 4, 8)}, bytes(8),
       "tensor 'a.0.v'", "overlap tensor 'a.0.w'"),
    st("st-hole", {"a.0.w": t("F32", [1], 0, 4), "a.0.v": t("F32", [1], 8, 12)}, bytes(12),
       "tensor 'a.0.v'", "bytes 4..8", "hole"),
    st("st-trailing-bytes", {"a.0.w": t("F32", [2], 0, 8)}, bytes(12), "4 bytes at the end belong to no tensor"),
    st("st-first-not-at-zero", {"a.0.w": t("F32", [1], 4, 8)}, bytes(8), "tensor 'a.0.w'", "bytes 0..4"),
    st("st-metadata-list", {"__metadata__": ["pt"], **GOOD_A}, bytes(8), "__metadata__",
       "mapping of strings to strings"),
    st("st-metadata-int-value", {"__metadata__": {"format": "pt", "step": 7}, **GOOD_A}, bytes(8),
       "__metadata__", "'step': 7"),
    st("st-duplicate-tensor", b'{"a.0.w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
       b'"a.0.w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', bytes(8), "'a.0.w' twice"),
    st("st-empty-name", {"": t("F32", [2], 0, 8)}, bytes(8), "empty name"),
    st("st-dtype-lowercase", {"a.0.w": t("f32", [2], 0, 8)}, bytes(8), "tensor 'a.0.w'", "'f32'",
       "did you mean 'F32'?"),
    st("st-offsets-typo", {"a.0.w": {"dtype": "F32", "shape": [2], "offsets": [0, 8]}}, bytes(8),
       "tensor 'a.0.w'", "missing data_offsets", "did you mean 'offsets'?"),
    st("st-nbytes-mismatch", {"a.0.w": t("BF16", [2, 3], 0, 8)}, bytes(8), "tensor 'a.0.w'", "needs 12"),
    st("st-shape-float", {"a.0.w": t("F32", [2.0], 0, 8)}, bytes(8), "tensor 'a.0.w'", "shape"),
    st("st-offsets-reversed", {"a.0.w": t("F32", [0], 8, 0)}, bytes(8), "tensor 'a.0.w'", "begin <= end"),
    st("st-no-module-path", {"w": t("F32", [2], 0, 8)}, bytes(8), "tensor 'w' has no module path"),
    st("st-sub-byte", {"a.0.w": t("F4", [4], 0, 2)}, bytes(2), "tensor 'a.0.w'", "F4"),
    # --from-safetensors: index and shards
    sharded("st-index-tensor-not-in-shard", {"a.0.w": "a.safetensors", "a.9.w": "b.safetensors"},
            "index.json", "'a.9.w' is mapped to 'b.safetensors', whose header lacks it"),
    sharded("st-shard-tensor-not-in-index", {"a.0.w": "a.safetensors"}, "a.safetensors",
            "holds tensor 'a.0.extra'", "does not list", extra={"a.safetensors": safetensors({**GOOD_A, "a.0.extra": t("F32", [1], 8, 12)}, bytes(12))}),
    sharded("st-shard-tensor-mapped-elsewhere",
            {"a.0.w": "a.safetensors", "a.1.w": "b.safetensors", "a.2.w": "c.safetensors"},
            "c.safetensors", "holds tensor 'a.0.w'", "maps to 'a.safetensors'",
            extra={"c.safetensors": safetensors({"a.0.w": t("F32", [2], 0, 8), "a.2.w": t("F32", [2], 8, 16)},
                                                bytes(16))}),
    sharded("st-index-missing-shard", {"a.0.w": "a.safetensors", "a.1.w": "gone.safetensors"},
            "index.json", "names shard 'gone.safetensors'"),
    sharded("st-index-map-is-list", ["a.safetensors"], "index.json", "weight_map", "mapping"),
    sharded("st-index-shard-not-a-string", {"a.0.w": 1}, "weight_map['a.0.w']", "expected a file name"),
    sharded("st-index-duplicate-key", None, "index.json", "'a.0.w' twice",
            index_text='{"weight_map": {"a.0.w": "a.safetensors", "a.0.w": "b.safetensors"}}'),
    sharded("st-bad-shard-header", {"a.0.w": "a.safetensors", "a.1.w": "b.safetensors"}, "b.safetensors",
            "overlap", extra={"b.safetensors": safetensors({"a.1.w": t("F32", [2], 0, 8),
                                                            "a.1.v": t("F32", [1], 0, 4)}, bytes(8))}),
    CliCase("st-folder-tensor-in-two-files", ("spec", "--from-safetensors", "{d}/ckpt"),
            {"ckpt/a.safetensors": safetensors(GOOD_A, bytes(8)), "ckpt/b.safetensors": safetensors(GOOD_A, bytes(8))},
            expect=("tensor 'a.0.w' is in both", "a.safetensors", "b.safetensors")),
]
