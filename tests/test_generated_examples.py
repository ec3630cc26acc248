"""The generated example specs against the publishers' parameter counts, and
`planner spec --from-hf-config` (regeneration and bad input; skipped without transformers)."""

from __future__ import annotations

import json
import math
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from cli_samples import invoke

from schemas.io import load_spec

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "examples" / "generated"
CONFIGS = ROOT / "examples" / "configs"

# published total parameter counts, in billions, as the publishers round them
PUBLISHED = {
    "llama-3-8b": "8.03",
    "llama-3-70b": "70.6",
    "mixtral-8x7b": "46.7",
    "qwen3-30b-a3b": "30.5",
    "deepseek-v2-lite": "15.7",
    "llama-3.2-1b": "1.23",
    "qwen2.5-0.5b": "0.49",
}
TIED = {"llama-3.2-1b", "qwen2.5-0.5b"}


def param_count(spec) -> int:
    """Elements of all parameters (not buffers), tied ones once."""
    return sum(math.prod(t.shape) for layer in spec.model.expanded() for t in layer.params if not t.buffer)


def within_rounding(count: int, published: str) -> bool:
    """Equal to the published figure up to one unit of its last digit (rounded or truncated)."""
    unit = Decimal(1).scaleb(Decimal(published).as_tuple().exponent)
    return abs(Decimal(count) / Decimal(10**9) - Decimal(published)) <= unit


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_committed_spec_matches_published_count(model: str) -> None:
    spec = load_spec(GENERATED / f"{model}.yaml")
    count = param_count(spec)
    assert within_rounding(count, PUBLISHED[model]), (model, count, PUBLISHED[model])
    header = (GENERATED / f"{model}.yaml").read_text().splitlines()[:2]
    assert header[0] == f"# Made by: planner spec --from-hf-config examples/configs/{model}/config.json"
    assert f"{count:,} parameters" in header[1]
    ties = [owner for layer in spec.model.expanded() for owner in layer.tied.values()]
    assert ties == (["model.embed_tokens.weight"] if model in TIED else [])


def test_within_rounding_can_fail() -> None:
    assert within_rounding(8_030_261_248, "8.03") and not within_rounding(8_050_000_000, "8.03")
    assert within_rounding(70_553_706_496, "70.6") and not within_rounding(70_400_000_000, "70.6")


def test_moe_specs_hold_their_experts() -> None:
    mixtral = load_spec(GENERATED / "mixtral-8x7b.yaml").model.expanded()
    blocks = [layer for layer in mixtral if layer.name.startswith("model.layers.")]
    assert len(blocks) == 32
    experts = sum(t.nbytes for t in blocks[0].params if ".experts." in f".{t.name}.")
    assert experts == 8 * 3 * 4096 * 14336 * 2  # eight experts of three bf16 matrices
    deepseek = load_spec(GENERATED / "deepseek-v2-lite.yaml").model.expanded()
    first, moe = deepseek[1], deepseek[2]
    assert not any("experts" in t.name for t in first.params)  # first_k_dense_replace: 1
    assert any("shared_experts" in t.name for t in moe.params) and len(deepseek) == 27 + 3


# ---------------------------------------------------------------------------
# --from-hf-config


def test_missing_transformers_is_a_clean_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    result = invoke("spec", "--from-hf-config", str(CONFIGS / "llama-3.2-1b" / "config.json"))
    assert result.exit_code == 2, result.output
    assert "pip install 'offload-planner[hf]'" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("content,expect", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ("[1]", "expected a JSON object"),
    ('{"hidden_size": 8}', "model_type: missing"),
])
def test_bad_configs(tmp_path: Path, content: str | None, expect: str) -> None:
    f = tmp_path / "config.json"
    if content is not None:
        f.write_text(content)
    result = invoke("spec", "--from-hf-config", str(f))
    assert result.exit_code == 2, result.output
    assert expect in result.stderr and "Traceback" not in result.output


def test_unknown_model_type(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "no-such-architecture"}))
    result = invoke("spec", "--from-hf-config", str(f))
    assert result.exit_code == 2, result.output
    assert "model_type 'no-such-architecture' is not known to the installed transformers" in result.stderr


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_regenerated_spec_matches_the_committed_one(model: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = json.loads((CONFIGS / model / "config.json").read_text())["model_type"]
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no '{model_type}' architecture")
    out = tmp_path / "spec.yaml"
    result = invoke("spec", "--from-hf-config", str(CONFIGS / model / "config.json"), "-o", str(out))
    assert result.exit_code == 0, result.output
    fresh, committed = load_spec(out), load_spec(GENERATED / f"{model}.yaml")
    assert fresh.model.name == model
    # totals and layers are stable across transformers versions; param layouts may not be
    assert param_count(fresh) == param_count(committed)
    assert [layer.name for layer in fresh.model.expanded()] == [layer.name for layer in committed.model.expanded()]
