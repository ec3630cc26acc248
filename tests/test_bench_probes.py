"""The experts' probes of issue 17 in their CPU modes: each path they time computes what the model does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))


def _rows(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_the_two_grouped_paths_agree_on_the_cpu(capsys):
    import probe_uva_paths

    assert probe_uva_paths.main(["--device", "cpu", "--small", "--tokens", "4", "64"]) == 0
    rows = [r for r in _rows(capsys) if r["kind"] == "paths"]
    assert [r["tokens"] for r in rows] == [4, 64]
    for r in rows:
        assert r["max_abs_diff"] == 0.0
        assert 0 < r["touched"] <= 16


def test_an_offloaded_model_gives_the_resident_logits_with_either_experts_kernel(capsys):
    import probe_experts_impl

    assert probe_experts_impl.main(["--device", "cpu", "--small", "--budget", "0.5", "--tokens", "1", "4"]) == 0
    rows = _rows(capsys)
    plan = next(r for r in rows if r["kind"] == "plan")
    assert plan["offloaded_bytes"] > 0
    steps = [r for r in rows if r["kind"] == "step"]
    assert {(r["placed"], r["kernel"], r["tokens"]) for r in steps} == {
        (p, k, t) for p in ("resident", "offloaded") for k in ("grouped_mm", "batched_mm") for t in (1, 4)}
    offloaded = [r for r in steps if r["placed"] == "offloaded"]
    assert all(r["same_as_resident"] for r in offloaded)


@pytest.mark.parametrize("interleave", [False, True])
def test_the_split_eager_probe_runs_its_plans_on_the_cpu(tmp_path, interleave):
    out = tmp_path / "split.jsonl"
    argv = [sys.executable, str(ROOT / "bench" / "probe_split_eager.py"), "--dry-run", "--out", str(out)]
    subprocess.run(argv + (["--interleave"] if interleave else []), check=True, cwd=ROOT, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    if interleave:
        row = next(r for r in rows if r.get("kind") == "interleaved")
        assert len(row["eager_ratio_per_round"]) == row["rounds"] == 8
        assert all(t > 0 for ts in row["eager_ms"].values() for t in ts)
    else:
        plans = [r["plan"] for r in rows if "issue_ms" in r]
        assert plans == ["resident", "uva", "hot", "hot, expert_graphs off", "hot+cpu"]
        assert all(r["top_self_cpu_us"] for r in rows if "issue_ms" in r)


def test_the_host_runs_probe_reads_at_least_the_touched_experts(capsys):
    """Each grouping of bench/probe_host_runs.py reads every touched expert, and only a joining one reads more."""
    import probe_host_runs

    assert probe_host_runs.main(["--small"]) == 0
    rows = _rows(capsys)
    assert {r["grouping"] for r in rows} == {"runs", "eighth", "gaps2", "span"} and {r["tokens"] for r in rows} == {1, 8}
    for r in rows:
        assert r["read_experts"] >= r["touched"] - 1e-9 and r["ms"] > 0
        if r["grouping"] == "runs":
            assert r["read_experts"] == pytest.approx(r["touched"])


def test_the_host_rows_probe_times_each_row_count_and_pad_and_restores_the_pad(capsys):
    import probe_host_rows_m

    from runtime import expert_math

    from runtime import host_matmul

    assert probe_host_rows_m.main(["--small"]) == 0
    rows = _rows(capsys)
    bmm = [r for r in rows if r["case"] == "bmm"]
    kernel = ("gate_up_kernel", "down_kernel") if host_matmul.library() is not None else ()
    assert {(r["proj"], r["rows"]) for r in bmm} == {(p, m) for p in ("gate_up", "gate_up_host", "down", "down_in_out",
                                                                      *kernel) for m in (1, 7)}
    host = [r for r in rows if r["case"] == "host_rows"]
    assert {(r["pad"], r["kernel"]) for r in host} == {(1, False), (16, False)} | ({(1, True)} if kernel else set())
    assert host_matmul.KERNEL
    packed = {"packed"} if probe_host_rows_m.packs_bf16() else set()  # oneDNN's bf16 packing needs AVX-512
    assert {r["kernel"] for r in rows if r["case"] == "loop"} == {"plain", *packed}
    assert all(r["ms"] > 0 for r in rows) and expert_math.PAD_ROWS == 1


def test_the_host_rule_probe_runs_each_way_and_restores_the_rule(capsys):
    import probe_host_rule

    from runtime import host_matmul

    before = host_matmul.MAX_PASSES
    assert probe_host_rule.main(["--small", "--routings", "3"]) == 0
    rows = _rows(capsys)
    assert {(r["shape"], r["tokens"], r["way"]) for r in rows} == {
        (s, t, w) for s, shape in probe_host_rule.SMALL.items() for t in shape[5] for w in ("rule", "kernel", "bmm")}
    built = host_matmul.library() is not None
    for r in rows:
        assert r["ms"] > 0 and len(r["passes"]) == 3 and r["calls"] == 6
        if r["way"] == "bmm" or not built:
            assert r["kernel_calls"] == 0
        elif r["way"] == "kernel":
            assert r["kernel_calls"] == 6
        else:  # the rule: the kernel exactly for the routings at most MAX_PASSES passes
            assert r["kernel_calls"] == 2 * sum(p <= host_matmul.MAX_PASSES for p in r["passes"])
    assert host_matmul.KERNEL and host_matmul.MAX_PASSES == before


def test_the_expert_prediction_probe_scores_both_guesses(capsys):
    import probe_expert_prediction

    assert probe_expert_prediction.main(["--device", "cpu", "--small", "--prompts", "1", "--new", "4"]) == 0
    rows = _rows(capsys)
    assert [r["guess"] for r in rows] == ["next_router", "same_as_last_token"]
    for r in rows:
        assert 0.0 <= r["hits"] <= 1.0 and r["top_k"] == 2 and r["steps"] == 4
    assert set(rows[0]["per_layer"]) == {"1", "2"}  # the first layer has no layer before it to guess from
