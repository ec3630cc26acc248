"""`planner spec --from-hf-config`: the structural checks (without transformers), the size cap,
the guard around the transformers build, and small real configs built on the meta device."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from cli_samples import invoke

from runtime.hf_config_check import Known, config_problems, estimated_params, size_problems
from schemas.errors import suggest
from schemas.io import load_spec

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "examples" / "configs"
LLAMA = json.loads((CONFIGS / "llama-3.2-1b" / "config.json").read_text())
SMALL = {"num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2}
KNOWN = Known("9.9", ["llama", "mllama", "llama4", "mixtral", "qwen3_moe"] + [f"model{i}" for i in range(300)],
              ["silu", "gelu", "relu"], ["default", "linear", "llama3"])


def small(**changes) -> dict:
    return {**LLAMA, **SMALL, **changes}


def messages(data: dict) -> list[str]:
    return [str(p) for p in config_problems(data, "cfg.json", KNOWN)]


# ---------------------------------------------------------------------------
# the checks, with the names transformers knows passed in


def test_a_good_config_has_no_problems() -> None:
    assert messages(small()) == []
    for folder in sorted(CONFIGS.iterdir()):  # every committed config passes
        data = json.loads((folder / "config.json").read_text())
        known = Known("9.9", [data["model_type"]], ["silu"], ["default", "llama3", "yarn"])
        assert config_problems(data, "c", known) == [], folder.name


def test_every_problem_is_reported_at_once_with_file_and_field() -> None:
    got = messages(small(hidden_size="abc", num_attention_heads=0, vocab_size=-3, torch_dtype="float3",
                         hidden_act="sillu", model_type="lamma"))
    assert got == [
        "cfg.json: model_type 'lamma' is not known to the installed transformers 9.9 (did you mean one of "
        "'llama', 'mllama', 'llama4'?)",
        "cfg.json: hidden_size: expected a positive whole number, got 'abc'",
        "cfg.json: num_attention_heads: expected a positive whole number, got 0",
        "cfg.json: vocab_size: expected a positive whole number, got -3",
        "cfg.json: torch_dtype: 'float3' is not a dtype a model is built in (did you mean 'float32'?) "
        "(expected one of float16, bfloat16, float32, float64)",
        "cfg.json: hidden_act: activation 'sillu' is not known to transformers 9.9 (did you mean 'silu'?)",
    ]


def test_null_means_absent_and_zero_is_allowed_where_it_means_none() -> None:
    assert messages(small(head_dim=None, q_lora_rank=None, first_k_dense_replace=0, n_shared_experts=0)) == []
    assert messages(small(first_k_dense_replace=-1)) == [
        "cfg.json: first_k_dense_replace: expected a whole number >= 0, got -1"]


def test_divisibility_only_where_it_decides_the_head_size() -> None:
    assert messages(small(hidden_size=66)) == []  # head_dim given: any hidden_size
    assert messages(small(hidden_size=66, head_dim=None)) == [
        "cfg.json: hidden_size: 66 is not a multiple of num_attention_heads 4 (and head_dim is not given)"]
    assert messages(small(num_key_value_heads=3)) == [
        "cfg.json: num_key_value_heads: num_attention_heads 4 is not a multiple of num_key_value_heads 3"]


def test_rope_checks_nested_per_attention_type() -> None:
    assert messages(small(rope_parameters={"full_attention": {"rope_type": "default"},
                                           "sliding_attention": {"rope_type": "linar", "factor": 2.0}})) == [
        "cfg.json: rope_parameters.sliding_attention.rope_type: RoPE type 'linar' is not known to "
        "transformers 9.9 (did you mean 'linear'?) (known: default, linear, llama3)"]


def test_sub_configs_are_checked_with_their_path() -> None:
    got = messages(small(text_config={"num_hidden_layers": 0, "vision_config": {"hidden_act": "gelu_x"}}))
    assert got == ["cfg.json: text_config.num_hidden_layers: expected a positive whole number, got 0",
                   "cfg.json: text_config.vision_config.hidden_act: activation 'gelu_x' is not known to "
                   "transformers 9.9 (did you mean one of 'gelu', 'relu'?)"]


def test_suggestions_are_a_short_list_never_the_whole_list() -> None:
    names = [f"model{i}" for i in range(300)]
    hint = suggest("model1x", names, n=3)
    assert hint.startswith(" (did you mean one of ") and hint.count("'") == 6
    assert suggest("zzzzzz", names, n=3) == ""
    message = messages(small(model_type="qqqqqq"))[0]
    assert "model1" not in message and "a newer transformers may have it" in message


def test_estimate_is_close_to_the_real_counts_and_the_cap_refuses() -> None:
    for folder in sorted(CONFIGS.iterdir()):
        data = json.loads((folder / "config.json").read_text())
        spec = load_spec(ROOT / "examples" / "generated" / f"{folder.name}.yaml")
        count = sum(math.prod(t.shape) for layer in spec.model.expanded() for t in layer.params if not t.buffer)
        assert 0.95 < estimated_params(data) / count < 1.5, folder.name
        assert size_problems(data, "c") == []
    assert [p.field for p in size_problems(small(num_hidden_layers=10_001), "c")] == ["num_hidden_layers"]
    assert size_problems(small(hidden_size=2**20, intermediate_size=2**20), "c") == []  # just under 10**13
    huge = size_problems(small(hidden_size=2**22, intermediate_size=2**22), "c")
    assert len(huge) == 1 and "refused" in str(huge[0]) and "hidden_size 4,194,304" in str(huge[0])


# ---------------------------------------------------------------------------
# through transformers and the CLI

transformers = pytest.importorskip("transformers")


def write(tmp_path: Path, data: dict | str) -> Path:
    f = tmp_path / "config.json"
    f.write_text(data if isinstance(data, str) else json.dumps(data))
    return f


def test_a_small_config_builds_its_layers(tmp_path: Path) -> None:
    out = tmp_path / "spec.yaml"
    result = invoke("spec", "--from-hf-config", str(tmp_path), "-o", str(out))  # a folder: its config.json
    assert result.exit_code == 2 and f"{tmp_path / 'config.json'}: no such file" in result.stderr
    write(tmp_path, small())
    result = invoke("spec", "--from-hf-config", str(tmp_path), "-o", str(out))
    assert result.exit_code == 0, result.output
    layers = [layer.name for layer in load_spec(out).model.expanded()]
    assert layers == ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2",
                      "model.norm", "lm_head"]


def test_what_transformers_raises_becomes_one_line_naming_file_and_model_type(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = write(tmp_path, small())

    def broken(*args, **kwargs):
        raise RuntimeError("the build broke\nsecond line that must not show")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", broken)
    result = invoke("spec", "--from-hf-config", str(f))
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"error: {f}: transformers {transformers.__version__} cannot build model_type "
                             "'llama': RuntimeError: the build broke\n")


def test_a_config_transformers_rejects_is_named(tmp_path: Path) -> None:
    f = write(tmp_path, small(rope_scaling={"rope_type": "yarn"}, tie_word_embeddings="yes"))
    result = invoke("spec", "--from-hf-config", str(f))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{f}: transformers" in result.stderr and "model_type 'llama'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_missing_torch_is_a_clean_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = write(tmp_path, small())
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    result = invoke("spec", "--from-hf-config", str(f))
    assert result.exit_code == 2, result.output
    assert "torch is not installed" in result.stderr and "offload-planner[hf]" in result.stderr


def test_the_spec_command_imports_runtime_only_for_hf_configs(tmp_path: Path) -> None:
    code = ("import sys; from typer.testing import CliRunner; from planner.cli.app import app; "
            f"r = CliRunner().invoke(app, ['spec', '--from-safetensors', {str(tmp_path / 'none')!r}]); "
            "assert r.exit_code == 2, r.output; "
            "print(sorted(m for m in ('torch', 'runtime', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
