"""Inputs a fuzz run of the command line found mishandled (2026-12-02): each now gets a message naming what is
wrong and exit 2, or a plan where the input is valid. Each case failed before (a traceback as exit 70, or exit 0
on bad input)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_samples import invoke

GENERATED = Path(__file__).resolve().parent.parent / "examples" / "generated"
SMALL = str(GENERATED / "llama-3.2-1b.yaml")


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plans") / "p.yaml"
    assert invoke("plan", SMALL, "-g", "2GB", "-o", str(path)).exit_code == 0
    return str(path)


@pytest.mark.parametrize("command", ["show", "explain"])
def test_a_plan_cannot_be_predicted_at_batch_auto_afterwards(small_plan, tmp_path, command):
    extra = []
    if command == "explain":
        stats = tmp_path / "stats.json"
        stats.write_text('{"backend": "prefetch", "pinned_host_bytes": 0, "forwards": [{"bytes_copied": 0, '
                         '"copy_ms": 0.0, "stall_ms": 0.0, "copy_gbps": 0.0, "late_copies": 0, "step_ms": 1.0, '
                         '"layers": []}]}')
        extra = ["--measured", str(stats)]
    result = invoke(command, small_plan, *extra, "--workload", "decode=auto@100")
    assert result.exit_code == 2, result.output
    assert "batch auto is chosen by planner plan" in result.output


def test_batch_auto_is_for_a_decode_step_not_a_prefill():
    result = invoke("plan", SMALL, "-g", "2GB", "-w", "prefill=auto@100")
    assert result.exit_code == 2
    assert "batch auto is for a decode step" in result.output


def test_a_scalar_embedding_is_costed_as_a_vector(tmp_path):
    spec = tmp_path / "x.yaml"
    spec.write_text("model:\n  name: x\n  dtype: bfloat16\n  layers:\n    - name: model.embed_tokens\n"
                    "      params: {weight: []}\n")
    result = invoke("plan", str(spec), "-o", str(tmp_path / "p.yaml"))
    assert result.exit_code == 0, result.output


def test_routed_experts_that_do_not_match_the_layers_moe_are_named(tmp_path):
    text = (GENERATED / "mixtral-8x7b.yaml").read_text()
    assert "moe: {experts: 8, top_k: 2}" in text
    spec = tmp_path / "mx5.yaml"
    spec.write_text(text.replace("moe: {experts: 8, top_k: 2}", "moe: {experts: 5, top_k: 2}"))
    result = invoke("plan", str(spec), "-g", "30GB", "-o", str(tmp_path / "p.yaml"))
    assert result.exit_code == 2
    assert "model.layers.0.mlp.experts.gate_up_proj holds 8 experts" in result.output
    assert "moe.experts is 5" in result.output


def test_an_empty_hardware_name_is_refused_with_its_line(tmp_path):
    spec = tmp_path / "h.yaml"
    spec.write_text(Path(SMALL).read_text() + 'hardware: ""\n')
    result = invoke("plan", str(spec), "-g", "2GB")
    assert result.exit_code == 2
    assert "hardware: must not be empty" in result.output


def test_a_chart_path_error_names_the_users_path(small_plan, tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "d.png"
    folder.mkdir()
    for path, why in ((str(tmp_path / "none" / "x.png"), "does not exist"), (str(folder), "give a file name")):
        result = invoke("show", small_plan, "--chart", path)
        assert result.exit_code == 2
        assert f"{path}: cannot write" in result.output and why in result.output
        assert ".tmp" not in result.output


def test_diff_of_stdin_against_itself_says_so(small_plan):
    result = invoke("diff", "-", "-", stdin=Path(small_plan).read_text())
    assert result.exit_code == 2
    assert "OLD and NEW both read stdin" in result.output


def test_routing_counts_above_the_tokens_routed_are_refused():
    from pydantic import ValidationError

    from schemas.routing import LayerRouting

    with pytest.raises(ValidationError, match="an expert received 200 tokens of the 100 routed"):
        LayerRouting(layer="model.layers.0", experts=8, top_k=2, tokens=100, counts=[200, 0, 0, 0, 0, 0, 0, 0])


def test_control_characters_from_the_input_are_escaped_in_errors(tmp_path):
    import json
    import struct

    header = json.dumps({"a\u0007\u001b[31m.weight": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 9]}})
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 8)
    result = invoke("spec", "--from-safetensors", str(path))
    assert result.exit_code == 2
    assert "\u0007" not in result.output and "\u001b" not in result.output
    assert "\\x07" in result.output


def test_a_folder_named_as_a_rank_plan_is_named_not_skipped(tmp_path):
    folder = tmp_path / "ranks"
    made = invoke("plan", SMALL, "--tp", "2", "-g", "2GB", "-o", str(folder))
    assert made.exit_code == 0, made.output
    (folder / "rank2.plan.yaml").mkdir()
    result = invoke("validate", str(folder))
    assert result.exit_code == 2
    assert "rank2.plan.yaml: named as a rank plan, but it is not a file" in result.output
