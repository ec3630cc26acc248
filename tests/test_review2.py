"""Regression tests for the findings of the second review (each failed before its fix)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_samples import invoke

LLAMA = "examples/llama-3-8b.yaml"


def test_rank_set_check_with_a_gap_is_not_up_to_date(tmp_path: Path) -> None:
    """`plan --tp 2 --check DIR` where DIR holds rank0 and rank2 (rank 1 gone): the set is not what the
    command makes, so it is out of date and rank 1 is named missing (it said 'up to date', exit 0)."""
    folder = tmp_path / "set"
    assert invoke("plan", LLAMA, "--tp", "2", "-g", "8GB", "-o", str(folder)).exit_code == 0
    (folder / "rank1.plan.yaml").rename(folder / "rank2.plan.yaml")
    text = invoke("plan", LLAMA, "--tp", "2", "-g", "8GB", "--check", str(folder))
    assert text.exit_code == 1, text.output
    assert "missing from the folder: rank1.plan.yaml" in text.stdout
    js = invoke("plan", LLAMA, "--tp", "2", "-g", "8GB", "--check", str(folder), "--diff-format", "json")
    data = json.loads(js.stdout)
    assert (js.exit_code, data["up_to_date"], data["missing_ranks"]) == (1, False, [1])


def test_check_plans_given_a_rank_plan_checks_its_set(tmp_path: Path, monkeypatch) -> None:
    """pre-commit passes the changed file ``tp/rank0.plan.yaml``; the manifest line names the folder
    (``--tp 2 -o tp``): that line is checked (it was refused as 'a plan that no line makes', exit 2)."""
    spec = Path(LLAMA).resolve()
    monkeypatch.chdir(tmp_path)
    Path("planner-plans.sh").write_text(f"planner plan {spec} --tp 2 -g 8GB -o tp\n")
    assert invoke("plan", str(spec), "--tp", "2", "-g", "8GB", "-o", "tp").exit_code == 0
    result = invoke("check-plans", "tp/rank0.plan.yaml")
    assert result.exit_code == 0, result.output
    assert "rank set tp: 2 of 2 rank plans up to date" in result.stdout
    assert "no line of planner-plans.sh" not in result.output


def test_export_names_any_embedding_by_its_kind() -> None:
    """export --to vllm: an offloaded GPT-2 position embedding (``transformer.wpe``) is 'an offloaded
    embedding' as schemas/kinds.py classifies it (the export guessed from 'embed'/'lm_head'/'wte' in the name)."""
    from planner.assemble import assemble
    from planner.assemble import Assignment
    from planner.layers import build_graph, layers_in_order
    from planner.vllm.export import export
    from schemas.io import parse_text
    from schemas.spec import SpecFile

    spec = SpecFile.model_validate(parse_text(GPT, "gpt.yaml"))
    layers = layers_in_order(build_graph(spec.model.expanded()))
    for name in ("transformer.wpe", "transformer.ln_f"):
        where = Assignment({name: {"weight": "uva"}}, None, "budget", "test", ())
        plan = assemble(layers, where, model_name="gpt", spec_sha256="0" * 64, gpu_budget=None, cpu_budget=None)
        (problem,) = export(plan).problems
        expected = "an offloaded embedding" if name.endswith("wpe") else "params offloaded outside the decoder layers"
        assert problem.part == expected
        assert name in problem.detail


GPT = """\
model:
  name: gpt
  dtype: float16
  layers:
    - name: transformer.wpe
      params: {weight: [1024, 256]}
    - name: transformer.h.{i}
      repeat: 4
      params:
        attn.c_attn.weight: [256, 768]
        mlp.c_fc.weight: [256, 1024]
    - name: transformer.ln_f
      params: {weight: [256]}
"""
