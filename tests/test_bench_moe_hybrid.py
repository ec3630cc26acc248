"""bench/bench_moe_hybrid.py in its CPU dry-run mode: every row the H200 run writes, on tiny shapes."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))


def _dry_run(tmp_path, *args: str) -> list[dict]:
    """The rows of ``bench_moe_hybrid.py --dry-run ARGS`` (torch's thread count, which the dry run sets, put back)."""
    import torch

    import bench_moe_hybrid

    threads = torch.get_num_threads()
    try:
        assert bench_moe_hybrid.main(["--dry-run", *args, "--out", str(tmp_path / "rows.jsonl")]) == 0
    finally:
        torch.set_num_threads(threads)
    return [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]


def test_the_dry_run_writes_every_row(tmp_path):
    import bench_moe_hybrid
    from schemas.io import load_routing

    rows = _dry_run(tmp_path)
    measured = [r for r in rows if "measured_ms" in r]
    plans = {(r["model"], r["plan"]) for r in measured}
    for model in ("qwen3_moe", "phimoe"):
        assert {(model, "uva"), (model, "hybrid"), (model, "auto prefill")} <= plans
        hybrid = [r for r in measured if r["model"] == model and r["plan"] == "hybrid"]
        assert {r["workload"] for r in hybrid} == {"decode32", "prefill", "decode1"}
        assert all(r["backend"] == "cpu" for r in hybrid)  # the dry run's profile gives the host experts
        assert all(r["host_ms_per_layer"]["layers"] > 0 for r in hybrid)  # the host computed in every workload
        exact = next(r["exactness"] for r in hybrid if r["workload"] == "decode32")
        assert exact["max_abs_diff"] <= exact["tolerance"] + 1e-6 and exact["top1_agree"] >= 0.99
        spread, pair = exact["position_max"], exact["tolerance_position_max"]  # per-position maxima's spread
        assert spread["max"] == exact["max_abs_diff"] and pair["max"] == exact["tolerance"]
        assert spread["median"] <= spread["p90"] <= spread["p99"] <= spread["max"]
        assert 0 <= exact["positions_above_pair_median"] <= 1
        assert (model, "auto decode32") in plans
    assert all(r["predicted_ms"] > 0 and r["measured_ms"] > 0 for r in measured)
    # eager rows are also predicted with the resident model's own block CPU time, measured in the run
    own = {r["model"]: r["own_cpu"] for r in rows if "own_cpu" in r}
    assert set(own) == {"qwen3_moe", "phimoe"} and all(o["figure"] == "moe_block_cpu_us" for o in own.values())
    assert all(r["predicted_model_cpu_ms"] > 0 for r in measured if r["mode"] == "eager")
    skewed = [r for r in measured if r["model"] == "qwen3_moe skewed"]
    # the resident model: the floor; the hot plan also without its split layers' CUDA graphs (none on the CPU)
    assert {r["plan"] for r in skewed} == {"resident", "uva", "hot", "hot, expert_graphs off", "hot+cpu"}
    assert {r["expert_graphs"] for r in skewed if r["plan"].startswith("hot")} == {True, False}
    ab = next(r for r in rows if r.get("plan", "").startswith("in turn") and r["model"] == "qwen3_moe skewed")
    assert set(ab["turns"]) == {"uva", "hot", "uva, expert_graphs off", "hot, expert_graphs off"}
    assert ab["span_ms"]["uva"]["/ uva"] == 1
    assert all(ab[key][label]["median"] > 0 for key in ("span_ms", "issue_ms") for label in ab["turns"])
    assert ab["one_layer_call_us"]["launched"]["done_us"] > 0  # no graphs on the CPU: the launched call alone
    # predicted as applied with apply's defaults (the planner assumes them): the turns without graphs are not
    assert set(ab["predicted_ms"]) == set(ab["predicted_model_cpu_ms"]) == {"uva", "hot"}
    assert set(ab["span_ratio_median_to"]) == {"uva", "uva, expert_graphs off"}
    assert set(ab["span_ratio_median_to"]["uva, expert_graphs off"]) == {"uva", "hot", "hot, expert_graphs off"}
    for model in ("qwen3_moe", "phimoe"):  # each uniform model's turns at decode 1: all-UVA, hybrid, auto, all-UVA launched
        (row,) = [r for r in rows if r.get("plan", "").startswith("in turn") and r["model"] == model]
        assert list(row["turns"]) == ["uva", "hybrid", "auto decode1", "uva, expert_graphs off"]
        assert set(row["predicted_ms"]) == {"uva", "hybrid", "auto decode1"}
        assert row["one_uva_layer_call_us"]["launched"]["done_us"] > 0  # the module's own forward (no graphs here)
    assert set(ab["span_ratio_median"]) == {"hot", "uva, expert_graphs off", "hot, expert_graphs off"}
    link = {r["plan"]: r["link_bytes_per_step"] for r in skewed if r["plan"] != "resident"}
    assert link["hot"] < link["uva"]  # the most used experts stay on the GPU
    tried = [r["hot_share_of_choices"] for r in rows if "bias" in r]  # the bias search: a ladder, then halvings
    assert min(abs(share - bench_moe_hybrid.HOT_TARGET) for share in tried) <= bench_moe_hybrid.HOT_TOLERANCE
    histogram = next(r["histogram"] for r in rows if "histogram" in r)
    assert histogram["top 20%"] >= 0.5 and len(histogram["deciles"]) == 10
    stats, sha = load_routing(tmp_path / "routing-skewed.yaml")
    assert len(sha) == 64 and stats.layers
    assert rows[-1]["total_s"] > 0


def test_the_pages_and_switch_interval_rows(tmp_path):
    """--host-pages measures the uva plan and auto's decode-32 plan on each kind of page (auto's twice), with the
    setting put back; --switch-interval likewise with Python's switch interval; --host-guard the host plans with the
    levels on and off; --own-host-figures auto's plan from the profile beside one from this run's host figures, twice;
    --host-share auto's plan made at another host_link_share, its split in a row of its own; --host-in-out auto's
    plan with the host's weights in each layout, twice, the layout put back; --host-load names its processes in the
    first row."""
    import bench_moe_hybrid
    from runtime import expert_math, pinned

    interval = sys.getswitchinterval()
    rows = _dry_run(tmp_path, "--only", "qwen3_moe", "--cases", "decode32", "--host-pages", "4k", "--host-pages", "huge",
                    "--switch-interval", "0.001", "--host-guard", "on", "--host-guard", "off", "--host-load", "1",
                    "--own-host-figures", "--host-share", "1.1", "--host-in-out", "", "--host-in-out", "down_proj")
    assert pinned.HUGE_PAGES is True and sys.getswitchinterval() == interval and expert_math.HOST_IN_OUT == frozenset()
    assert rows[0]["host_load_processes"] == 1
    assert rows[0]["host_cpu"]["cpus"] >= rows[0]["host_cpu"]["cores"] >= 1  # hyperthreads under physical cores
    labels = [r["plan"] for r in rows if "measured_ms" in r]
    assert labels.count("auto decode32, pages 4k") == labels.count("auto decode32, pages huge") == 2
    assert labels.count("uva, pages 4k") == labels.count("uva, pages huge") == 1
    assert labels.count("auto decode32, switch interval 0.001") == 1
    assert labels.count("auto decode32, profile") == labels.count("auto decode32, this run's host figures") == 2
    assert labels.count("auto decode32, host_link_share 1.1") == 1
    assert labels.count("auto decode32, host stores [in, out]: none") == 2
    assert labels.count("auto decode32, host stores [in, out]: down_proj") == 2
    assert [r for r in rows if r.get("plan") == "auto decode32, host_link_share 1.1" and "splits" in r]
    guarded = [r for r in rows if ", guard " in r.get("plan", "") and "measured_ms" in r]
    assert len(guarded) == 8 and {r["host_guard"] for r in guarded} == {True, False}
    assert all(r["host_experts"]["moved_calls"] == 0 for r in guarded)  # no guard off a GPU
    assert all(set(r["host_experts"]["judged_ms"]) == set(bench_moe_hybrid.HOST_JUDGED_KEYS) for r in guarded)


def test_the_exactness_at_each_level(tmp_path):
    """--exact-levels applies the hybrid plan with every split layer held at one level (none of its host-memory
    experts on the host, half the plan's, the plan's, every one) and compares the logits with the resident model's
    at each: the host computes as many experts as the level says, level "none" is the GPU's kernel bit for bit (on
    the CPU: the host's own kernel, so within the tolerance), and each row names the positions compared."""
    rows = _dry_run(tmp_path, "--only", "qwen3_moe", "--cases", "decode32", "--exact-levels")
    levels = {r["level"]: r for r in rows if "level" in r}
    assert list(levels) == ["none", "half", "plan", "all"]
    held = [levels[name]["host_experts"] for name in levels]
    assert held[0] == 0 < held[2] <= held[3] and held[1] <= held[2]  # (the tiny plan may put all on the host)
    for row in levels.values():
        exact = row["exactness"]
        assert exact["positions"] == 32 and len(exact["batch_max_abs_diff"]) == 1 and exact["tolerance_top1_agree"] > 0.9
        assert exact["max_abs_diff"] <= exact["tolerance"] + 1e-6 and exact["top1_agree"] >= 0.99


def test_the_turns_alone(tmp_path):
    """--turns-only --turn-rounds N: the skewed part and each uniform model measure only their side-by-side eager
    turns, N rounds on the GPU (one in the dry run), each round's ratio to the all-UVA turn kept."""
    rows = _dry_run(tmp_path, "--only", "skewed", "--only", "qwen3_moe", "--turns-only", "--turn-rounds", "3")
    assert not [r for r in rows if "measured_ms" in r]
    skewed, uniform = ([r for r in rows if r.get("plan", "").startswith("in turn") and r["model"] == m]
                       for m in ("qwen3_moe skewed", "qwen3_moe"))
    (turns,) = skewed
    assert all(len(v) == 1 for v in turns["span_ratio_per_round"].values())
    assert list(turns["turns"]) == ["uva", "hot", "uva, expert_graphs off", "hot, expert_graphs off"]
    assert len(uniform) == 1
    # the turns cycle over distinct one-token inputs, and are also predicted with the routing those inputs take
    import bench_moe_hybrid

    for row in (turns, *uniform):
        assert row["inputs"] == bench_moe_hybrid.TURN_TOKENS > 1
        assert set(row["predicted_routed_ms"]) == set(row["predicted_ms"])
        assert all(v > 0 for v in row["predicted_routed_ms"].values())
    # at one token the all-UVA plan reads k experts whatever the routing: the same prediction either way
    assert uniform[0]["predicted_routed_ms"]["uva"] == pytest.approx(uniform[0]["predicted_ms"]["uva"], rel=1e-6)


def test_predictions_with_a_calibrated_profile(tmp_path):
    """--calibrated FILE: every measured row and every side-by-side turn is also predicted with that profile (the
    one `planner calibrate` writes on the machine), the plans still made with --profile."""
    from conftest import ROOT as root

    profile = str(root / "schemas" / "profiles" / "h200.yaml")
    rows = _dry_run(tmp_path, "--only", "qwen3_moe", "--cases", "decode1", "--calibrated", profile)
    measured = [r for r in rows if "measured_ms" in r]
    assert measured and all(r["ratio_calibrated"] == pytest.approx(r["predicted_calibrated_ms"] / r["measured_ms"],
                                                                   rel=1e-3) for r in measured)
    # the dry run plans with a fast host (its own profile); the bundled one prices the hybrid's host part slower
    hybrid = next(r for r in measured if r["plan"] == "hybrid")
    assert hybrid["predicted_calibrated_ms"] > hybrid["predicted_ms"]
    (turns,) = [r for r in rows if r.get("plan", "").startswith("in turn")]
    assert list(turns["turns"]) == ["uva", "hybrid", "auto decode1", "auto decode1, calibrated",
                                    "uva, expert_graphs off"]
    assert set(turns["predicted_calibrated_ms"]) == set(turns["predicted_ms"])
    assert all(v > 0 for v in turns["predicted_calibrated_ms"].values())
