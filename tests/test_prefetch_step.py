"""prefetch_step as in vLLM: the number of buffer slots, 2 by default, 1 allowed, never the longest run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import make_spec, weights_only

import planner
from planner.errors import InfeasibleError
from schemas import SpecFile, dump_model, load_plan, load_spec
from schemas.plan_content import PLAN_VERSION

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BLOCK = {"attn.w": [16, 16], "mlp.w1": [32, 16], "mlp.w2": [16, 32]}


@pytest.fixture(scope="module")
def llama_all_params() -> SpecFile:
    """examples/llama-3-8b.yaml with ``params: [mlp]`` removed: every param of a block may be offloaded."""
    data = load_spec(EXAMPLES / "llama-3-8b.yaml").model_dump(mode="json")
    del data["offload"]["params"]
    return weights_only(SpecFile.model_validate(data))


def test_smallest_prefetch_budget_is_what_stays_plus_two_slots(llama_all_params):
    """Offloading every block needs two slots, not one per block (the old longest-run rule: the whole model)."""
    layers = llama_all_params.model.expanded()
    blocks = [layer.nbytes for layer in layers if layer.name.startswith("model.layers.")]
    stays = sum(layer.nbytes for layer in layers) - sum(blocks)  # embedding, final norm, lm_head
    with pytest.raises(InfeasibleError) as err:
        planner.plan(llama_all_params, gpu_budget=1, backend="prefetch")
    smallest = err.value.min_gpu_budget
    assert smallest is not None and smallest <= (stays + 2 * max(blocks)) * 1.01
    plan = planner.plan(llama_all_params, gpu_budget=smallest, backend="prefetch")
    s = plan.summary
    assert s.offloaded_layers == 32 and plan.buffer_pool.slots == 2 and s.peak_gpu_bytes == smallest


def test_budget_and_group_default_to_two_slots():
    spec = make_spec([BLOCK] * 12)
    total = sum(layer.nbytes for layer in spec.model.expanded())
    budget = planner.plan(spec, gpu_budget=total // 2, backend="prefetch", strategy="budget")
    group = planner.plan(spec, strategy="group", group_size=4, num_in_group=3, backend="prefetch")
    for plan in (budget, group):
        assert plan.summary.prefetch_step == 2 and plan.buffer_pool.slots == 2
        assert any(n.startswith("prefetch_step 2 (the default: double buffering)") for n in plan.summary.notes)
        offloaded = [layer for layer in plan.layers if layer.offloaded]
        assert [layer.prefetch.slot for layer in offloaded] == [j % 2 for j in range(len(offloaded))]
    # group 4/3 offloads runs of 3: the stall note, which recommends no step
    note = next(n for n in group.summary.notes if "will stall" in n)
    assert "runs of up to 3 consecutive offloaded layers" in note and "prefetch_step" not in note


def test_one_slot_end_to_end(tmp_path):
    spec = make_spec([BLOCK] * 6)
    plan = planner.plan(spec, strategy="group", group_size=2, num_in_group=1, prefetch_step=1, backend="prefetch")
    offloaded = [layer for layer in plan.layers if layer.offloaded]
    assert plan.summary.prefetch_step == 1 and plan.buffer_pool.slots == 1 and len(offloaded) == 3
    assert plan.summary.buffer_bytes == offloaded[0].offloaded_bytes  # one layer's worth
    assert all(layer.prefetch.slot == 0 for layer in offloaded)
    # each copy is issued right after the previous offloaded layer: before the layer that follows it
    names = [layer.name for layer in plan.layers]
    for before, layer in zip(offloaded[-1:] + offloaded[:-1], offloaded):
        assert layer.prefetch.copy_before == names[(names.index(before.name) + 1) % len(names)]
    assert [layer.prefetch.previous_forward for layer in offloaded] == [True, False, False]
    path = tmp_path / "one-slot.plan.yaml"
    path.write_text(dump_model(plan))
    assert load_plan(path) == plan  # the plan check recomputes the same schedule


@pytest.mark.parametrize("step,n", [(3, 3), (5, 3), (1, 1), (8, 1)])
def test_as_many_slots_as_layers_warns_that_no_memory_is_saved(step, n):
    spec = make_spec([BLOCK] * 6)
    g = 6 // n
    plan = planner.plan(spec, strategy="group", group_size=g, num_in_group=1, prefetch_step=step, backend="prefetch")
    s = plan.summary
    assert s.offloaded_layers == n and plan.buffer_pool.slots == n
    assert s.peak_gpu_bytes == s.total_bytes  # the pool holds every offloaded layer
    warning = next(note for note in s.notes if note.startswith("warning:"))
    assert "saves no GPU memory" in warning
    if n > 1:
        assert f"prefetch_step {n - 1} or less" in warning


def test_no_note_recommends_one_slot_per_offloaded_layer(llama_all_params):
    for budget in (4, 6, 9, 12):
        for step in (None, 1, 2, 3):
            plan = planner.plan(llama_all_params, gpu_budget=budget * 10**9, prefetch_step=step, backend="prefetch")
            n = plan.summary.offloaded_layers
            suggested = [int(x) for note in plan.summary.notes for x in re.findall(r"prefetch_step (\d+)", note)]
            assert all(x < n for x in suggested), (budget, step, plan.summary.notes)
            assert not any(note.startswith("warning:") for note in plan.summary.notes)  # budget plans save memory


def test_plan_version_is_2():
    plan = planner.plan(make_spec([BLOCK] * 4), strategy="group", group_size=2, backend="prefetch")
    assert PLAN_VERSION == 2 and plan.plan_version == 2 and dump_model(plan).startswith("plan_version: 2\n")
