import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, make_spec, weights_only
from pydantic import ValidationError

import planner
from schemas.spec_hash import spec_sha256
from planner.errors import InfeasibleError, PlanningError
from schemas import Plan, SpecFile, dump_model, load_spec
from schemas.io import load_model
from schemas.workload import DEFAULT_WORKLOAD

GB = 10**9
MLP = {"attn.w": [8, 8], "mlp.w1": [32, 8], "mlp.w2": [8, 32]}  # 128 + 512 + 512 bytes in bf16


def test_llama8b_example_plans_with_real_sizes(llama8b):
    plan = planner.plan(llama8b, backend="prefetch")
    s = plan.summary
    assert s.total_bytes == 8_030_261_248 * 2
    assert [layer.name for layer in plan.layers] == (
        ["model.embed_tokens"] + [f"model.layers.{i}" for i in range(32)] + ["model.norm", "lm_head"])
    assert all(len(layer.params) == 9 for layer in plan.layers[1:33])
    assert s.backend == "prefetch" and s.peak_gpu_bytes <= 12 * GB < s.total_bytes
    assert s.peak_gpu_bytes == s.resident_bytes + s.buffer_bytes
    assert s.pinned_host_bytes == s.offloaded_bytes == sum(layer.offloaded_bytes for layer in plan.layers)
    mlp_bytes = 3 * 14336 * 4096 * 2
    offloaded = [layer for layer in plan.layers if layer.offloaded]
    assert all(layer.offloaded == ["mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
               for layer in offloaded)
    assert s.offloaded_bytes == len(offloaded) * mlp_bytes == s.offloaded_layers * mlp_bytes
    # the file's prefetch_step 2: 2 slots of the three mlp weights
    assert s.prefetch_step == 2 and plan.buffer_pool.slots == 2 and s.buffer_bytes == 2 * mlp_bytes
    assert [k.param for k in plan.buffer_pool.keys] == sorted(k.param for k in plan.buffer_pool.keys)
    assert s.spec_sha256 == spec_sha256(llama8b) and s.backend_reason == "prefetch requested"
    # minimal: one layer fewer would not fit
    assert s.total_bytes - (len(offloaded) - 1) * mlp_bytes + 2 * mlp_bytes > 12 * GB


def test_llama8b_example_backend_auto_takes_the_faster_backend(llama8b):
    """backend auto: the same params on the other backend either do not fit or predict no faster a step."""
    from planner.assemble import Assignment, assemble
    from planner.cost.predict import predict

    plan = planner.plan(llama8b)
    s = plan.summary
    assert s.backend in ("prefetch", "uva") and s.peak_gpu_bytes <= 12 * GB
    other = "uva" if s.backend == "prefetch" else "prefetch"
    where = {layer.name: dict.fromkeys(layer.offloaded, other) for layer in plan.layers if layer.offloaded}
    alt = assemble(llama8b.model.expanded(), Assignment(where, 2, "budget", "", ()), model_name=s.model,
                   spec_sha256="0" * 64, checked=False)
    alt_ms = predict(alt, plan.predictions.profile, llama8b.workload or DEFAULT_WORKLOAD).weighted_step_ms
    if alt.summary.peak_gpu_bytes <= 12 * GB:
        assert plan.predictions.weighted_step_ms <= alt_ms
        assert f"against {alt_ms:.1f} ms" in s.backend_reason
    else:
        assert "over the" in s.backend_reason


@pytest.mark.parametrize("name", ["llama-3-8b", "mixtral-8x7b", "llama-3.2-1b"])
def test_examples_plan_and_round_trip(name, tmp_path):
    plan = planner.plan(load_spec(EXAMPLES / f"{name}.yaml"))
    assert plan.summary.peak_gpu_bytes <= plan.summary.gpu_budget_bytes
    for fmt in ("yaml", "json"):
        path = tmp_path / f"plan.{fmt}"
        path.write_text(dump_model(plan, fmt))
        assert load_model(Plan, path) == plan


def test_mixtral_offloads_only_experts():
    plan = planner.plan(load_spec(EXAMPLES / "mixtral-8x7b.yaml"))
    assert plan.summary.total_bytes == 46_702_792_704 * 2
    layer = next(layer for layer in plan.layers if layer.offloaded)
    assert len(layer.offloaded) == 24 and all(".experts." in p for p in layer.offloaded)


def test_tied_embedding_counted_once_and_never_offloaded():
    spec = load_spec(EXAMPLES / "llama-3.2-1b.yaml")
    plan = planner.plan(spec, params=["weight"], gpu_budget=1 * GB)
    head, embed = plan.layer("lm_head"), plan.layer("model.embed_tokens")
    assert plan.summary.total_bytes == 1_235_814_400 * 2
    assert head.tied == {"weight": "model.embed_tokens.weight"} and head.resident_bytes == 0
    assert head.params["weight"].shape == [128256, 2048] and not head.offloaded and not embed.offloaded
    assert any("lm_head.weight shares model.embed_tokens.weight" in n for n in plan.summary.notes)


def test_tied_owner_in_the_stack_stays_resident():
    blocks = [dict(MLP) for _ in range(4)]
    spec = make_spec(blocks)
    data = spec.model_dump(mode="json")
    data["model"]["layers"][-1]["tied"] = {"alias": "model.layers.3.mlp.w1"}
    from schemas import SpecFile
    plan = planner.plan(SpecFile.model_validate(data), strategy="group", group_size=1, num_in_group=1)
    assert plan.layer("model.layers.3").offloaded == ["attn.w", "mlp.w2"]
    assert plan.layer("model.layers.2").offloaded == ["attn.w", "mlp.w1", "mlp.w2"]


def test_group_strategy_follows_the_rule(llama8b):
    plan = planner.plan(llama8b, strategy="group", group_size=4, num_in_group=1, gpu_budget=100 * GB)
    offloaded = [layer.name for layer in plan.layers if layer.offloaded]
    assert offloaded == [f"model.layers.{i}" for i in range(3, 32, 4)]
    assert plan.summary.backend == "prefetch" and plan.summary.strategy == "group"
    plan = planner.plan(llama8b, strategy="group", group_size=4, num_in_group=3, gpu_budget=100 * GB)
    assert plan.summary.prefetch_step == 2  # the file's
    assert any("runs of up to 3 consecutive offloaded layers" in n and "will stall" in n for n in plan.summary.notes)


def test_group_without_block_stack_is_a_planning_error():
    spec = make_spec([], head=True)
    with pytest.raises(PlanningError, match="block stack"):
        planner.plan(spec, strategy="group", group_size=2)


def test_overrides_are_validated(llama8b):
    with pytest.raises(ValidationError):
        planner.plan(llama8b, strategy="group", group_size=2, num_in_group=3)
    with pytest.raises(ValidationError):
        planner.plan(llama8b, prefetch_step=0)
    with pytest.raises(ValidationError):
        planner.plan(llama8b, gpu_budget=0)
    # the spec hash is of the file, not of the overrides
    assert planner.plan(llama8b, gpu_budget=13 * GB).summary.spec_sha256 == spec_sha256(llama8b)


def test_whole_model_fits_or_no_budget(llama8b):
    plan = planner.plan(llama8b, gpu_budget=17 * GB)
    assert plan.summary.backend == "none" and plan.summary.offloaded_bytes == 0 and plan.buffer_pool is None
    assert any("fits" in n and "nothing offloaded" in n for n in plan.summary.notes)
    spec = make_spec([dict(MLP)] * 3)
    for strategy in (None, "budget"):  # the default (auto) and budget
        plan = planner.plan(spec, strategy=strategy)
        assert plan.summary.backend == "none" and any("without a gpu_budget" in n for n in plan.summary.notes)
        assert plan.summary.offloaded_bytes == 0


def test_infeasible_reports_the_smallest_budget(llama8b, llama_auto):
    for spec in (llama8b, llama_auto):
        with pytest.raises(InfeasibleError) as err:
            planner.plan(spec, gpu_budget=3 * GB)
        best = err.value.min_gpu_budget
        assert best is not None and best > 3 * GB and str(best) in err.value.message
        assert planner.plan(spec, gpu_budget=best).summary.peak_gpu_bytes == best
        with pytest.raises(InfeasibleError):
            planner.plan(spec, gpu_budget=best - 1)
    with pytest.raises(InfeasibleError) as err:
        planner.plan(llama8b, gpu_budget=10 * GB, backend="none")
    assert err.value.min_gpu_budget == llama8b_total()


@pytest.fixture(scope="module")
def llama_auto(llama8b):
    """The Llama-3-8B example without the file's prefetch_step, so the planner picks it."""
    data = llama8b.model_dump(mode="json")
    del data["offload"]["prefetch_step"]
    return SpecFile.model_validate(data)


def llama8b_total() -> int:
    return 8_030_261_248 * 2


def test_auto_falls_back_to_uva_and_explicit_backends(llama8b, llama_auto):
    uva_floor = llama8b_total() - 32 * 3 * 14336 * 4096 * 2
    plan = planner.plan(llama_auto, gpu_budget=uva_floor + 10**6)
    assert plan.summary.backend == "uva" and plan.buffer_pool is None and plan.summary.buffer_bytes == 0
    assert "UVA fits" in plan.summary.backend_reason
    assert all(layer.prefetch is None for layer in plan.layers)
    plan = planner.plan(llama8b, backend="uva")
    assert plan.summary.backend == "uva" and plan.summary.peak_gpu_bytes == plan.summary.resident_bytes
    with pytest.raises(InfeasibleError) as err:
        planner.plan(llama_auto, gpu_budget=uva_floor + 10**6, backend="prefetch")
    assert err.value.min_gpu_budget > uva_floor + 10**6


def test_cpu_budget_caps_pinned_bytes(llama8b):
    with pytest.raises(InfeasibleError) as err:
        planner.plan(llama8b, cpu_budget=10**9)
    assert err.value.min_gpu_budget is not None and err.value.min_gpu_budget > 12 * GB
    plan = planner.plan(llama8b, gpu_budget=err.value.min_gpu_budget, cpu_budget=10**9)
    assert plan.summary.pinned_host_bytes <= 10**9
    with pytest.raises(InfeasibleError, match="cpu_budget"):
        planner.plan(llama8b, strategy="group", group_size=2, cpu_budget=10**9, gpu_budget=None)


def test_prefetch_entries_match_the_schedule(llama8b, llama_auto):
    stalls = planner.plan(llama8b, gpu_budget=6 * GB, backend="prefetch")  # the file's prefetch_step 2, long runs
    assert stalls.summary.prefetch_step == 2 and any("will stall" in n for n in stalls.summary.notes)
    plan = planner.plan(llama_auto, gpu_budget=10 * GB, backend="prefetch")
    names = [layer.name for layer in plan.layers]
    offloaded = [layer for layer in plan.layers if layer.offloaded]
    assert plan.summary.prefetch_step == 2 and plan.buffer_pool.slots == 2  # the default: double buffering
    assert any("prefetch_step 2 (the default: double buffering)" in n for n in plan.summary.notes)
    for j, layer in enumerate(offloaded):
        assert layer.prefetch.slot == j % plan.buffer_pool.slots
        before = names.index(layer.prefetch.copy_before)
        assert (before <= names.index(layer.name)) != layer.prefetch.previous_forward or before == names.index(
            layer.name)


def test_plan_is_deterministic_across_processes(tmp_path):
    code = ("import sys, planner, schemas; s = schemas.load_spec(sys.argv[1]); "
            "sys.stdout.write(schemas.dump_model(planner.plan(s, gpu_budget=9 * 10**9), sys.argv[2]))")
    outs = []
    for seed in ("1", "2"):
        for fmt in ("yaml", "json"):
            env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
            outs.append(subprocess.run([sys.executable, "-c", code, str(EXAMPLES / "mixtral-8x7b.yaml"), fmt],
                                       capture_output=True, text=True, check=True, env=env).stdout)
    assert outs[0] == outs[2] and outs[1] == outs[3] and outs[0] != outs[1]
    spec = load_spec(EXAMPLES / "mixtral-8x7b.yaml")
    here = planner.plan(spec, gpu_budget=9 * 10**9)
    assert dump_model(here, "yaml") == outs[0] == dump_model(planner.plan(spec, gpu_budget=9 * 10**9,
                                                                          prefetch_step=None), "yaml")


def test_planning_never_imports_torch_or_networkx():
    code = ("import sys, planner; import schemas; "
            "planner.plan(schemas.load_spec(sys.argv[1])); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'networkx')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, str(EXAMPLES / "llama-3-8b.yaml")], check=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert not any("import torch" in p.read_text() for p in (ROOT / "planner").glob("*.py")
                   if p.name not in ("cli.py", "show.py"))


def test_synthetic_spec_plans(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench.synthetic_spec import synthetic_spec_text

    path = Path(tmp_path / "big.yaml")
    path.write_text(synthetic_spec_text(200, 20, hidden=64, gpu_budget="12MB"))
    plan = planner.plan(weights_only(load_spec(path)))
    assert len(plan.layers) == 203 and all(len(layer.params) == 20 for layer in plan.layers[1:201])
    assert plan.summary.peak_gpu_bytes <= 12 * 10**6 < plan.summary.total_bytes
