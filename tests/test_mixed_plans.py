"""Mixed plans: a backend per param (prefetch or UVA) in one plan; format, plan check, assembly,
offload.backends, cost model, show and diff. The runtime side is in tests/test_runtime_mixed.py."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

import planner
from cli_samples import invoke
from corpus.plans import SPEC_TEXT
from planner.assemble import assemble
from planner.assemble import Assignment
from planner.review.diff import diff_plans
from planner.review.diff_render import render_diff
from planner.errors import PlanningError
from planner.cost.layer import layer_work
from schemas import SpecFile, load_spec
from schemas.hardware import load_hardware
from schemas.io import dump_model, parse_text, plan_data
from schemas.plan import Plan

HW = load_hardware("h200")
GROUP = dict(strategy="group", group_size=3, num_in_group=2, prefetch_step=2, backend="prefetch")


@pytest.fixture(scope="module")
def tiny() -> SpecFile:
    return SpecFile.model_validate(parse_text(SPEC_TEXT, "spec"))


def _check(plan: Plan) -> list[str]:
    """The plan check's findings for ``plan``'s data after edits (empty: consistent)."""
    try:
        Plan.model_validate(plan_data(plan))
    except ValidationError as err:
        return [str(err)]
    return []


def _redo(plan: Plan, edit) -> str:
    data = plan_data(plan)
    edit(data)
    with pytest.raises(ValidationError) as err:
        Plan.model_validate(data)
    return str(err.value)


# -- the planner: offload.backends ---------------------------------------------------------

def test_backends_put_listed_kinds_on_their_backend(tiny):
    plan = planner.plan(tiny, **GROUP, backends={"attention": "uva"})
    assert plan.summary.backend == "mixed"
    offloaded = [layer for layer in plan.layers if layer.offloaded]
    assert [layer.name for layer in offloaded] == ["blocks.1", "blocks.2", "blocks.4", "blocks.5"]
    for layer in offloaded:
        assert layer.uva == ["attn.qkv"] and layer.prefetched == ["mlp.w1", "mlp.w2", "norm.weight"]
        assert layer.prefetch is not None
    assert {k.param for k in plan.buffer_pool.keys} == {"mlp.w1", "mlp.w2", "norm.weight"}
    # the pool holds the prefetched params only: 2 slots of (256 + 496 + 16) bytes
    assert plan.buffer_pool.bytes == 2 * (256 + 496 + 16) == plan.summary.buffer_bytes
    assert plan.summary.offloaded_bytes == 4 * 1152  # UVA and prefetched params both count
    assert "attention uva" in plan.summary.backend_reason


def test_backends_equal_to_the_backend_give_a_plain_plan(tiny):
    plain = planner.plan(tiny, **GROUP)
    same = planner.plan(tiny, **GROUP, backends={"attention": "prefetch"})
    assert same.summary.backend == "prefetch"
    assert [layer.model_dump() for layer in same.layers] == [layer.model_dump() for layer in plain.layers]
    assert same.buffer_pool == plain.buffer_pool


def test_every_eligible_kind_on_uva_makes_a_uva_plan(tiny):
    plan = planner.plan(tiny, **GROUP, kinds=["attention"], backends={"attention": "uva"})
    assert plan.summary.backend == "uva" and plan.buffer_pool is None and plan.summary.prefetch_step is None
    assert all(layer.uva == layer.offloaded for layer in plan.layers)


def test_uva_plans_list_every_offloaded_param(tiny):
    plan = planner.plan(tiny, gpu_budget=3000, backend="uva")
    assert plan.summary.offloaded_bytes > 0
    assert all(layer.uva == layer.offloaded for layer in plan.layers)
    assert all(not layer.uva for layer in planner.plan(tiny, **GROUP).layers)


def test_budget_search_counts_only_the_prefetched_pool():
    spec = load_spec("examples/generated/qwen3-30b-a3b.yaml")
    budget = 24 * 10**9
    mixed = planner.plan(spec, gpu_budget=budget, strategy="budget", backend="prefetch",
                         backends={"routed_experts": "uva"})
    assert mixed.summary.backend == "mixed" and mixed.summary.peak_gpu_bytes <= budget
    keys = {k.param for k in mixed.buffer_pool.keys}
    assert keys and not any("experts" in k for k in keys)  # routed experts need no buffer
    experts = [rel for layer in mixed.layers for rel in layer.offloaded if "mlp.experts." in rel]
    assert experts and all(rel in layer.uva for layer in mixed.layers for rel in layer.offloaded
                           if "mlp.experts." in rel)
    plain = planner.plan(spec, gpu_budget=budget, strategy="budget", backend="prefetch")
    assert mixed.summary.buffer_bytes < plain.summary.buffer_bytes


def test_auto_with_backends_keeps_autos_choice_for_other_kinds():
    spec = load_spec("examples/generated/qwen3-30b-a3b.yaml")
    plan = planner.plan(spec, gpu_budget=24 * 10**9, strategy="budget",
                        backends={"attention": "prefetch", "routed_experts": "uva"})
    assert plan.summary.backend == "mixed"
    assert plan.summary.backend_reason.startswith("offload.backends: attention prefetch, routed_experts uva; other kinds auto")


def test_backends_validation(tiny):
    with pytest.raises(ValidationError, match="routed_experts"):
        planner.plan(tiny, **GROUP, backends={"routed_expert": "uva"})
    with pytest.raises(ValidationError, match="Input should be 'prefetch', 'uva' or 'cpu'"):
        planner.plan(tiny, **GROUP, backends={"attention": "none"})
    with pytest.raises(ValidationError, match="the cpu backend computes routed experts only"):
        planner.plan(tiny, **GROUP, backends={"attention": "cpu"})
    with pytest.raises(ValidationError, match="backend 'none' offloads nothing"):
        planner.plan(tiny, backend="none", backends={"attention": "uva"})
    with pytest.raises(ValidationError, match="which kinds leaves out"):
        planner.plan(tiny, **GROUP, kinds=["dense_mlp"], backends={"attention": "uva"})


def test_spec_hash_unchanged_without_backends(tiny):
    from schemas.spec_hash import spec_sha256

    with_backends = tiny.model_copy(update={"offload": tiny.offload.model_copy(update={"backends": {"norm": "uva"}})})
    assert spec_sha256(with_backends) != spec_sha256(tiny)
    assert '"backends"' not in tiny.model_dump_json(exclude={"offload": {"backends"}})


# -- assemble: any layer, any mix -----------------------------------------------------------

def _assemble(spec: SpecFile, where, step=None) -> Plan:
    return assemble(spec.model.expanded(), Assignment(where, step, "budget", "by hand"), model_name="tiny",
                    spec_sha256="0" * 64)


UNTIED = SPEC_TEXT.replace("      tied:\n        weight: embed.weight\n", "      params:\n        weight: [64, 8]\n")


def test_assemble_any_layer_and_mix():
    tiny = SpecFile.model_validate(parse_text(UNTIED, "spec"))
    where = {"embed": {"weight": "uva"}, "head": {"weight": "prefetch"}, "blocks.0": {"attn.qkv": "prefetch", "mlp.w1": "uva"},
             "blocks.3": {"mlp.w2": "uva"}, "blocks.5": {"mlp.w1": "prefetch", "norm.weight": "prefetch"}}
    plan = _assemble(tiny, where)
    assert plan.summary.backend == "mixed"
    by = {layer.name: layer for layer in plan.layers}
    assert by["embed"].uva == ["weight"] and by["embed"].prefetch is None
    assert by["blocks.3"].prefetch is None  # all its offloaded params are on UVA
    assert by["blocks.0"].prefetch is not None and by["blocks.5"].prefetch is not None
    assert plan.summary.prefetch_step == 2  # the default: two slots
    assert plan.buffer_pool.slots == 2
    assert by["head"].prefetch is not None  # the last layer: not in the block stack, prefetched
    assert {k.param for k in plan.buffer_pool.keys} == {"attn.qkv", "mlp.w1", "norm.weight", "weight"}
    assert by["blocks.0"].offloaded == ["attn.qkv", "mlp.w1"]  # in the spec's order
    assert not _check(plan)


@pytest.mark.parametrize("where,words", [
    ({"head": {"weight": "uva"}}, "tied"),
    ({"embed": {"weight": "prefetch"}}, "has params tied to it"),
    ({"blocks.9": {"mlp.w1": "uva"}}, "not in the spec"),
    ({"blocks.1": {"mlp.w3": "uva"}}, "not a param"),
    ({"blocks.1": {"mlp.w1": "cpu"}}, "backend 'cpu'"),
])
def test_assemble_refuses_what_cannot_move(tiny, where, words):
    with pytest.raises(PlanningError, match=words):
        _assemble(tiny, where)


def test_assemble_matches_the_budget_strategy_byte_for_byte():
    spec = load_spec("examples/llama-3-8b.yaml")
    plan = planner.plan(spec, gpu_budget=12 * 10**9)
    where = {layer.name: {p: "uva" if p in layer.uva else "prefetch" for p in layer.offloaded}
             for layer in plan.layers if layer.offloaded}
    s = plan.summary
    again = assemble(spec.model.expanded(), Assignment(where, spec.offload.prefetch_step, s.strategy, s.backend_reason, (s.notes[0],)),
                     model_name=s.model, spec_sha256=s.spec_sha256, gpu_budget=s.gpu_budget_bytes,
                     cpu_budget=s.cpu_budget_bytes, memory=plan.memory)
    mine = again.summary.notes
    assert plan.summary.notes[:len(mine)] == mine  # the planner adds its memory notes after the assignment's
    summary = again.summary.model_copy(update={"notes": plan.summary.notes})
    assert dump_model(again.model_copy(update={"predictions": plan.predictions, "summary": summary})) == dump_model(plan)


# -- the plan check ---------------------------------------------------------------------------

def test_check_uva_must_be_offloaded_and_once(tiny):
    plan = planner.plan(tiny, **GROUP, backends={"attention": "uva"})
    assert not _check(plan)
    text = _redo(plan, lambda d: d["layers"][2]["uva"].append("mlp.w9"))
    assert "layers[2].uva[1]" in text and "not an offloaded param" in text
    text = _redo(plan, lambda d: d["layers"][2]["uva"].append("attn.qkv"))
    assert "layers[2].uva[1]" in text and "listed more than once" in text
    text = _redo(plan, lambda d: d["layers"][4].setdefault("uva", []).append("mlp.w1"))  # blocks.3: resident
    assert "layers[4].uva[0]: 'mlp.w1' is not an offloaded param" in text


def test_check_backend_agrees_with_the_lists(tiny):
    mixed = planner.plan(tiny, **GROUP, backends={"attention": "uva"})
    assert "backend 'prefetch' copies every offloaded param" in _redo(
        mixed, lambda d: d["summary"].update(backend="prefetch"))
    text = _redo(mixed, lambda d: d["summary"].update(backend="uva"))
    assert "backend 'uva' reads every offloaded param through UVA" in text and "buffer_pool" in text
    uva = planner.plan(tiny, gpu_budget=3000, backend="uva")
    assert "every offloaded param is on UVA (use 'uva')" in _redo(uva, lambda d: d["summary"].update(backend="mixed"))
    plain = planner.plan(tiny, **GROUP)
    assert "no layer lists a param under uva (use 'prefetch')" in _redo(
        plain, lambda d: d["summary"].update(backend="mixed"))


def test_check_pool_and_schedule_from_prefetched_params(tiny):
    mixed = planner.plan(tiny, **GROUP, backends={"attention": "uva"})

    def pool_with_attention(d):
        d["buffer_pool"]["keys"].insert(0, {"param": "attn.qkv", "shape": [24, 8], "dtype": "float16", "bytes": 384,
                                            "slots": [0, 1]})
    assert "no offloaded param needs a buffer attn.qkv" in _redo(mixed, pool_with_attention)

    def all_uva(d):  # blocks.4 reads everything through UVA: the schedule runs over 3 layers
        d["layers"][5]["uva"] = list(d["layers"][5]["offloaded"])
    text = _redo(mixed, all_uva)
    assert "layers[5].prefetch: a prefetch entry, but every offloaded param of the layer is on UVA" in text
    assert "over 3 offloaded layers" in text

    def missing_entry(d):
        d["layers"][2].pop("prefetch")
    assert "prefetches params (offloaded, not on UVA) under the mixed backend but has no prefetch entry" in _redo(
        mixed, missing_entry)


def test_a_valid_hand_made_mixed_plan_loads(tiny):
    plan = _assemble(tiny, {"blocks.2": {"attn.qkv": "uva", "mlp.w1": "prefetch"}, "blocks.4": {"mlp.w1": "uva"}})
    data = plan_data(plan)
    assert Plan.model_validate(json.loads(json.dumps(data))) == plan


# -- the cost model -------------------------------------------------------------------------

def test_layer_work_reads_uva_params_over_the_link_and_copies_the_others(tiny):
    plan = planner.plan(tiny, **GROUP, backends={"attention": "uva"})
    layer = plan.layer("blocks.1")
    work = layer_work(layer, 1, HW)
    assert work.copy_bytes == 256 + 496 + 16  # the prefetched params only
    all_copied = layer.model_copy(update={"uva": []})
    all_uva = layer.model_copy(update={"uva": list(layer.offloaded)})
    assert layer_work(all_copied, 1, HW).copy_bytes == 1152 and layer_work(all_uva, 1, HW).copy_bytes == 0
    assert layer_work(all_copied, 1, HW).gpu_ms < work.gpu_ms < layer_work(all_uva, 1, HW).gpu_ms
    assert math.isfinite(plan.predictions.weighted_step_ms)


# -- show and diff ----------------------------------------------------------------------------

def test_show_marks_uva_params_and_diff_reports_the_switch(tiny, tmp_path):
    mixed = planner.plan(tiny, **GROUP, backends={"attention": "uva"})
    plain = planner.plan(tiny, **GROUP)
    (tmp_path / "m.yaml").write_text(dump_model(mixed))
    (tmp_path / "p.yaml").write_text(dump_model(plain))
    shown = invoke("show", str(tmp_path / "m.yaml"))
    assert shown.exit_code == 0, shown.output
    assert "attn.qkv (uva)" in shown.stdout and "mlp.w1 (uva)" not in shown.stdout and "copy before" in shown.stdout
    rows = json.loads(invoke("show", str(tmp_path / "m.yaml"), "--format", "json").stdout)["layers"]
    assert rows[2]["uva"] == ["attn.qkv"] and rows[0]["uva"] == []
    d = diff_plans(plain, mixed)
    assert d.changed and d.churn.to_host == 0 and d.churn.to_gpu == 0 and d.churn.between_host == 4
    [group] = d.moves
    assert (group.old, group.new, group.params) == ("host (prefetch)", "host (uva)", ["attn.qkv"])
    assert group.layers == [f"blocks.{i}" for i in (1, 2, 4, 5)]
    assert "blocks.{1,2,4,5}: attn.qkv host (prefetch) -> host (uva)" in render_diff(d)
    back = diff_plans(mixed, plain)
    assert [(g.old, g.new, g.layers) for g in back.moves] == [("host (uva)", "host (prefetch)", group.layers)]


def test_cli_backends_option(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC_TEXT)
    out = tmp_path / "p.yaml"
    r = invoke("plan", str(tmp_path / "s.yaml"), "--strategy", "group", "--group-size", "3", "--num-in-group", "2",
               "--backend", "prefetch", "--backends", "attention=uva, norm=uva", "-o", str(out))
    assert r.exit_code == 0, r.output
    plan = Plan.model_validate(parse_text(out.read_text(), "p"))
    assert plan.summary.backend == "mixed" and plan.layer("blocks.1").uva == ["attn.qkv", "norm.weight"]
