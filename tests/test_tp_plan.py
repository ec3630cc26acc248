"""Tensor-parallel planning (planner/tp/ranks.py): rank plans of the bundled specs, the default shard rules,
how bytes add up over the ranks, the rank folder (written, shown, diffed) and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_samples import TINY_SPEC, invoke

import planner
from planner.tp.shard_rules import default_rule
from planner.tp.split import ShardError, split_spec
from schemas.io import dump_model, load_plan, load_spec
from schemas.rank_plans import check_set, load_set
from schemas.shard import local_shape
from schemas.spec_hash import spec_sha256

ROOT = Path(__file__).resolve().parent.parent
SPECS = {
    "llama-3-8b": (ROOT / "examples/llama-3-8b.yaml", 8 * 10**9),
    "mixtral-8x7b": (ROOT / "examples/mixtral-8x7b.yaml", 40 * 10**9),
    "deepseek-v2-lite": (ROOT / "examples/generated/deepseek-v2-lite.yaml", 6 * 10**9),
}


def _model_bytes(spec) -> int:
    return sum(layer.nbytes for layer in spec.model.expanded())


@pytest.fixture(scope="module", params=[(name, tp) for name in SPECS for tp in (2, 4)], ids=lambda p: f"{p[0]}-tp{p[1]}")
def rank_set(request):
    name, tp = request.param
    path, budget = SPECS[name]
    spec = load_spec(path)
    return spec, tp, budget, planner.plan_ranks(spec, tp, gpu_budget=budget)


def test_bytes_add_up_over_the_ranks(rank_set) -> None:
    spec, tp, _, plans = rank_set
    replicated = split_spec(spec, tp).replicated_bytes
    assert replicated > 0  # norms at least
    assert sum(p.summary.total_bytes for p in plans) == _model_bytes(spec) + (tp - 1) * replicated


def test_each_rank_fits_the_per_gpu_budget(rank_set) -> None:
    _, _, budget, plans = rank_set
    for p in plans:
        assert p.summary.gpu_budget_bytes == budget
        assert p.summary.peak_gpu_bytes <= budget


def test_ranks_differ_only_in_rank(rank_set) -> None:
    _, tp, _, plans = rank_set
    assert [p.summary.rank for p in plans] == list(range(tp))
    assert {p.summary.world_size for p in plans} == {tp}
    first = plans[0].model_dump()
    for p in plans[1:]:
        other = p.model_dump()
        other["summary"]["rank"] = 0
        assert other == first


def test_rank_plan_is_the_spec_cut_by_its_shards(rank_set) -> None:
    spec, tp, _, plans = rank_set
    plan = plans[1]
    assert plan.summary.spec_sha256 == spec_sha256(spec)
    whole = {layer.name: {t.name: t for t in layer.params} for layer in spec.model.expanded()}
    for layer in plan.layers:
        for rel, p in layer.params.items():
            if rel in layer.tied:
                continue
            assert p.shard is not None
            assert tuple(p.shape) == local_shape(whole[layer.name][rel].shape, p.shard, tp)
    check_set(plans, [f"rank{r}" for r in range(tp)])


def test_rank_plans_load_back_unchanged(rank_set, tmp_path: Path) -> None:
    _, _, _, plans = rank_set
    written = planner.write_rank_plans(plans, tmp_path / "set")
    assert [p.name for p in written] == [f"rank{r}.plan.yaml" for r in range(len(plans))]
    assert load_set(tmp_path / "set") == plans


def test_the_split_halves_what_each_rank_moves() -> None:
    path, _ = SPECS["llama-3-8b"]
    spec = load_spec(path)
    one = planner.plan(spec, gpu_budget=10 * 10**9, backend="prefetch", strategy="budget")
    two = planner.plan_ranks(spec, 2, gpu_budget=5 * 10**9, backend="prefetch", strategy="budget")[0]
    assert two.summary.total_bytes * 2 - one.summary.total_bytes == split_spec(spec, 2).replicated_bytes
    assert two.summary.offloaded_bytes < one.summary.offloaded_bytes


def test_tp_1_rank_plan_is_the_whole_model() -> None:
    spec = load_spec(SPECS["llama-3-8b"][0])
    (only,) = planner.plan_ranks(spec, 1, gpu_budget=12 * 10**9)
    assert only.summary.total_bytes == _model_bytes(spec)
    assert (only.summary.rank, only.summary.world_size) == (0, 1)


# ---------------------------------------------------------------------------
# default rules


@pytest.mark.parametrize("layer,name,shard", [
    ("model.layers.0", "self_attn.q_proj.weight", "dim0"),
    ("model.layers.0", "self_attn.qkv_proj.bias", "dim0"),
    ("transformer.h.0", "self_attention.query_key_value.weight", "dim0"),
    ("model.layers.0", "self_attn.o_proj.weight", "dim1"),
    ("model.layers.0", "self_attn.o_proj.bias", "replicated"),
    ("model.layers.0", "attention.wo.weight", "dim1"),
    ("transformer.h.0", "self_attention.dense.weight", "dim1"),
    ("model.layers.0", "self_attn.kv_a_proj_with_mqa.weight", "replicated"),
    ("model.layers.0", "self_attn.kv_b_proj.weight", "dim0"),
    ("model.layers.0", "mlp.gate_up_proj.weight", "dim0"),
    ("model.layers.0", "mlp.down_proj.weight", "dim1"),
    ("model.layers.0", "mlp.fc2.bias", "replicated"),
    ("model.layers.0", "mlp.shared_experts.up_proj.weight", "dim0"),
    ("model.layers.0", "mlp.shared_experts.down_proj.weight", "dim1"),
    ("model.layers.0", "mlp.experts.gate_up_proj", "experts"),
    ("model.layers.0", "mlp.experts.down_proj", "experts"),
    ("model.layers.0", "block_sparse_moe.experts.3.w1.weight", "dim0"),
    ("model.layers.0", "block_sparse_moe.experts.3.w2.weight", "dim1"),
    ("model.layers.0", "block_sparse_moe.gate.weight", "replicated"),
    ("model.layers.0", "input_layernorm.weight", "replicated"),
    ("model.embed_tokens", "weight", "vocab"),
    ("lm_head", "weight", "vocab"),
    ("model.layers.0", "mlp.down_proj.weight_scale", "replicated"),
])
def test_default_rule(layer: str, name: str, shard: str) -> None:
    rule = default_rule(layer, name)
    assert rule is not None and rule.shard == shard


def test_unmatched_params_stay_replicated_and_are_noted() -> None:
    assert default_rule("model.layers.0", "mixer.A_log") is None
    assert default_rule("model.layers.0", "self_attn.q_proj.weight", buffer=True).shard == "replicated"
    plans = planner.plan_ranks(load_spec_text(TINY_SPEC), 2, backend="none", gpu_budget=10**6)
    notes = " ".join(plans[0].summary.notes)
    # embed.weight 1600 + head.weight 1600 + 4 x (mlp.w1 512 + mlp.w2 512) = 7296 bytes: no rule knows these names
    assert "4 param(s) (7.12 KiB in all their layers) match no shard rule" in notes
    assert "embed.weight, blocks.0.mlp.w1, blocks.0.mlp.w2, head.weight" in notes
    assert plans[0].layer("blocks.0").params["mlp.w1"].shard == "replicated"
    assert plans[0].layer("blocks.0").params["norm.weight"].shard == "replicated"
    assert "row-parallel" not in notes  # nothing is split by input features


def test_explicit_shard_overrides_the_rule() -> None:
    text = TINY_SPEC.replace("mlp.w1: [32, 8]", "mlp.w1: {shape: [32, 8], shard: dim0}").replace(
        "mlp.w2: [8, 32]", "mlp.w2: {shape: [8, 32], shard: dim1}")
    plans = planner.plan_ranks(load_spec_text(text), 2, backend="none", gpu_budget=10**6)
    params = plans[0].layer("blocks.0").params
    assert (params["mlp.w1"].shape, params["mlp.w1"].shard) == ([16, 8], "dim0")
    assert (params["mlp.w2"].shape, params["mlp.w2"].shard) == ([8, 16], "dim1")
    assert "2 param(s)" in " ".join(plans[0].summary.notes)  # embed and head are still unmatched


def load_spec_text(text: str):
    from schemas.io import load_model
    from schemas.spec import SpecFile

    return load_model(SpecFile, "spec.yaml", text)


def test_uneven_split_names_every_param() -> None:
    spec = load_spec(SPECS["llama-3-8b"][0])
    with pytest.raises(ShardError) as info:
        split_spec(spec, 3)
    text = str(info.value)
    assert "self_attn.k_proj.weight" in text and "size 1024" in text and "world size 3" in text
    assert "model.embed_tokens" not in text  # 128256 divides by 3


# ---------------------------------------------------------------------------
# the rank folder


def test_folder_keeps_exactly_the_new_set(tmp_path: Path) -> None:
    spec = load_spec_text(TINY_SPEC)
    four = planner.plan_ranks(spec, 4, backend="none", gpu_budget=10**6)
    planner.write_rank_plans(four, tmp_path)
    (tmp_path / "notes.txt").write_text("kept")
    two = planner.plan_ranks(spec, 2, backend="none", gpu_budget=10**6)
    planner.write_rank_plans(two, tmp_path, "json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "rank0.plan.json", "rank1.plan.json"]
    assert load_set(tmp_path) == two


def test_a_failed_write_leaves_the_old_set(tmp_path: Path) -> None:
    spec = load_spec_text(TINY_SPEC)
    planner.write_rank_plans(planner.plan_ranks(spec, 2, backend="none", gpu_budget=10**6), tmp_path)
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}

    class Broken:
        pass

    with pytest.raises(Exception):
        planner.write_rank_plans([*planner.plan_ranks(spec, 4, backend="none", gpu_budget=10**6)[:3], Broken()], tmp_path)  # type: ignore[list-item]
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before


def test_mixed_sets_are_refused(tmp_path: Path) -> None:
    spec = load_spec_text(TINY_SPEC)
    planner.write_rank_plans(planner.plan_ranks(spec, 2, backend="none", gpu_budget=10**6), tmp_path / "a")
    other = load_spec_text(TINY_SPEC.replace("name: tiny", "name: other"))
    planner.write_rank_plans(planner.plan_ranks(other, 2, backend="none", gpu_budget=10**6), tmp_path / "b")
    (tmp_path / "b" / "rank0.plan.yaml").replace(tmp_path / "a" / "rank0.plan.yaml")
    result = invoke("show", str(tmp_path / "a"))
    assert result.exit_code == 2
    assert "made from another spec" in result.output


# ---------------------------------------------------------------------------
# the command line


def test_cli_writes_shows_and_diffs_rank_sets(tmp_path: Path) -> None:
    spec = str(SPECS["llama-3-8b"][0])
    out = invoke("plan", spec, "--tp", "2", "-g", "8GB", "-o", str(tmp_path / "a"))
    assert out.exit_code == 0, out.output
    assert "wrote 2 rank plans" in out.stdout and "the slowest rank sets the step: rank 0" in out.stdout
    plan = load_plan(tmp_path / "a" / "rank1.plan.yaml")
    assert (plan.summary.rank, plan.summary.world_size) == (1, 2)
    assert plan.summary.spec_sha256 == spec_sha256(load_spec(spec))
    shown = invoke("show", str(tmp_path / "a"), "-f", "json")
    assert shown.exit_code == 0
    data = json.loads(shown.stdout)
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and data["slowest_rank"] == 0
    assert data["step_ms"] == plan.predictions.weighted_step_ms
    table = invoke("show", str(tmp_path / "a"))
    assert "2 rank plans (tensor parallel)" in table.stdout and "collectives are not modelled" in table.stdout
    assert invoke("show", str(tmp_path / "a" / "rank0.plan.yaml")).exit_code == 0
    assert invoke("diff", str(tmp_path / "a"), str(tmp_path / "a")).exit_code == 0
    assert invoke("plan", spec, "--tp", "4", "-g", "8GB", "-o", str(tmp_path / "b")).exit_code == 0
    diff = invoke("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert diff.exit_code == 1
    assert "world size 2 -> 4" in diff.stdout and "rank 1:" in diff.stdout
    assert "[2048, 4096] -> [1024, 4096]" in diff.stdout


def test_spec_parallel_tp_and_the_flag_override(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(TINY_SPEC + "parallel: {tp: 2}\n")
    out = invoke("plan", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "set"))
    assert out.exit_code == 0, out.output
    assert sorted(p.name for p in (tmp_path / "set").iterdir()) == ["rank0.plan.yaml", "rank1.plan.yaml"]
    single = invoke("plan", str(tmp_path / "s.yaml"), "--tp", "1")
    assert single.exit_code == 0 and "world_size" not in single.stdout


def test_tp_1_is_the_usual_plan() -> None:
    spec = str(SPECS["llama-3-8b"][0])
    assert invoke("plan", spec, "--tp", "1").stdout == invoke("plan", spec).stdout


def test_spec_without_parallel_keeps_its_hash() -> None:
    spec = load_spec(SPECS["llama-3-8b"][0])
    assert "parallel" not in spec.model_dump_json(exclude_none=True)
    with_tp = load_spec_text(Path(SPECS["llama-3-8b"][0]).read_text() + "parallel: {tp: 2}\n")
    assert spec_sha256(with_tp) != spec_sha256(spec)
    assert dump_model(spec)  # the spec still dumps


def test_diff_names_a_changed_shard_and_another_rank() -> None:
    """Two rank plans of one set differ only in rank (a model change, said first); a param split another
    way is a param change with its name and both values, not only a shape change."""
    from planner.review.diff import diff_plans
    from planner.review.diff_render import render_diff

    spec = load_spec(SPECS["llama-3-8b"][0])
    plans = planner.plan_ranks(spec, 2, gpu_budget=8 * 10**9)
    ranks = diff_plans(plans[0], plans[1])
    assert ranks.changed and "model:\n  rank: 0 -> 1" in render_diff(ranks, "text")
    data = plans[0].model_dump()
    layer = next(lay for lay in data["layers"] if "self_attn.o_proj.weight" in lay["params"])
    assert layer["params"]["self_attn.o_proj.weight"]["shard"] == "dim1"
    layer["params"]["self_attn.o_proj.weight"]["shard"] = "dim0"
    other = type(plans[0]).model_validate(data)
    text = render_diff(diff_plans(plans[0], other), "text")
    assert "shard" in text and "dim1" in text and "dim0" in text and "o_proj.weight" in text


def test_check_a_committed_rank_set(tmp_path: Path) -> None:
    """`plan --tp N --check DIR`: every rank checked like one plan; up to date, out of date (with the diff
    and one refresh command for the whole set), and a set made for another number of ranks."""
    spec = str(SPECS["llama-3-8b"][0])
    folder = str(tmp_path / "set")
    assert invoke("plan", spec, "--tp", "2", "-g", "8GB", "-o", folder).exit_code == 0
    same = invoke("plan", spec, "--tp", "2", "-g", "8GB", "--check", folder)
    assert same.exit_code == 0, same.output
    assert f"rank set {folder}: 2 of 2 rank plans up to date" in same.stdout
    assert same.stdout.count("is up to date") == 2
    changed = invoke("plan", spec, "--tp", "2", "-g", "6GB", "--check", folder)
    assert changed.exit_code == 1
    assert "rank0.plan.yaml is out of date" in changed.stdout and "rank1.plan.yaml is out of date" in changed.stdout
    assert f"0 of 2 rank plans up to date; refresh with: planner plan {spec} --gpu-budget 6GB --tp 2 -o {folder}" \
        in changed.stdout
    other = invoke("plan", spec, "--tp", "4", "-g", "8GB", "--check", folder, "--diff-format", "json")
    assert other.exit_code == 1
    data = json.loads(other.stdout)
    assert (data["committed_ranks"], data["made_ranks"], data["up_to_date"]) == (2, 4, False)
    assert [r["status"] for r in data["ranks"]] == ["changed", "changed"]  # world size and shapes differ
    assert data["refresh"].endswith(f"--tp 4 -o {folder}")
    md = invoke("plan", spec, "--tp", "2", "-g", "6GB", "--check", folder, "--diff-format", "markdown")
    assert md.exit_code == 1 and "Refresh with:\n\n```sh\n" in md.stdout
