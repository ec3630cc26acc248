"""Planning MoE models by kind: offload.kinds selects, offload.prefer orders the budget search."""

import copy
import os
import subprocess
import sys

import pytest
import yaml
from cli_samples import invoke
from conftest import EXAMPLES, ROOT, WEIGHTS_ONLY, plan_within, weights_only
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import planner
from planner.errors import InfeasibleError
from schemas.kinds import param_kind
from planner.strategy.spread_order import last_first
from schemas import Plan, SpecFile, dump_model, load_spec
from schemas.io import load_model

GB = 10**9
ROUTED = "routed_experts"


def _spec(layers: list[dict], offload: dict | None = None, dtype: str = "bfloat16", name: str = "toy") -> SpecFile:
    data: dict = {"model": {"name": name, "dtype": dtype, "layers": layers}, "memory": dict(WEIGHTS_ONLY)}
    if offload:
        data["offload"] = offload
    return SpecFile.model_validate(data)


def qwen_moe_block(hidden: int = 32, experts: int = 4, inter: int = 64) -> dict:
    """A Qwen2-MoE decoder block: attention with biases, router, routed experts, a gated shared expert."""
    p: dict = {"input_layernorm.weight": [hidden]}
    for proj, rows in (("q", hidden), ("k", hidden // 2), ("v", hidden // 2)):
        p[f"self_attn.{proj}_proj.weight"] = [rows, hidden]
        p[f"self_attn.{proj}_proj.bias"] = [rows]
    p["self_attn.o_proj.weight"] = [hidden, hidden]
    p["post_attention_layernorm.weight"] = [hidden]
    p["mlp.gate.weight"] = [experts, hidden]
    for e in range(experts):
        p |= {f"mlp.experts.{e}.gate_proj.weight": [inter, hidden], f"mlp.experts.{e}.up_proj.weight": [inter, hidden],
              f"mlp.experts.{e}.down_proj.weight": [hidden, inter]}
    p |= {"mlp.shared_expert.gate_proj.weight": [2 * inter, hidden],
          "mlp.shared_expert.up_proj.weight": [2 * inter, hidden],
          "mlp.shared_expert.down_proj.weight": [hidden, 2 * inter], "mlp.shared_expert_gate.weight": [1, hidden]}
    return p


def qwen_moe(num_layers: int = 8, offload: dict | None = None) -> SpecFile:
    return _spec([{"name": "model.embed_tokens", "params": {"weight": [256, 32]}},
                  {"name": "model.layers.{i}", "repeat": num_layers, "params": qwen_moe_block()},
                  {"name": "model.norm", "params": {"weight": [32]}},
                  {"name": "lm_head", "params": {"weight": [256, 32]}}], offload, name="qwen-moe-toy")


def _fp8(shape: list[int]) -> dict:
    return {"shape": shape, "dtype": "float8_e4m3fn"}


def _scale(shape: list[int]) -> dict:
    return {"shape": [-(-shape[0] // 16), -(-shape[1] // 16)], "dtype": "float32"}


def deepseek_like(num_layers: int = 6, dense: int = 1, offload: dict | None = None) -> SpecFile:
    """DeepSeek-V3 in miniature: MLA attention, the first layers dense, fp8 weights with block scales."""
    h, inter, experts = 32, 48, 4
    layers: list[dict] = [{"name": "model.embed_tokens", "params": {"weight": [256, h]}}]
    for i in range(num_layers):
        p: dict = {"input_layernorm.weight": [h], "post_attention_layernorm.weight": [h]}
        mats = {"self_attn.q_a_proj": [24, h], "self_attn.q_b_proj": [h, 24], "self_attn.kv_a_proj_with_mqa": [20, h],
                "self_attn.kv_b_proj": [h, 16], "self_attn.o_proj": [h, h]}
        p |= {"self_attn.q_a_layernorm.weight": [24], "self_attn.kv_a_layernorm.weight": [16]}
        if i < dense:
            mats |= {"mlp.gate_proj": [inter, h], "mlp.up_proj": [inter, h], "mlp.down_proj": [h, inter]}
        else:
            p |= {"mlp.gate.weight": {"shape": [experts, h], "dtype": "float32"},
                  "mlp.gate.e_score_correction_bias": {"shape": [experts], "dtype": "float32"}}
            for who in [f"experts.{e}" for e in range(experts)] + ["shared_experts"]:
                mats |= {f"mlp.{who}.gate_proj": [inter, h], f"mlp.{who}.up_proj": [inter, h],
                         f"mlp.{who}.down_proj": [h, inter]}
        for name, shape in mats.items():
            p[f"{name}.weight"] = _fp8(shape)
            p[f"{name}.weight_scale_inv"] = _scale(shape)
        layers.append({"name": f"model.layers.{i}", "params": p})
    layers += [{"name": "model.norm", "params": {"weight": [h]}}, {"name": "lm_head", "params": {"weight": [256, h]}}]
    return _spec(layers, offload, name="deepseek-toy")


@pytest.fixture(scope="module")
def mixtral() -> SpecFile:
    """The Mixtral-8x7B example with every param eligible (the file limits offload to the experts)."""
    data = load_spec(EXAMPLES / "mixtral-8x7b.yaml").model_dump(mode="json")
    del data["offload"]["params"]
    return weights_only(SpecFile.model_validate(data))


def _offloaded(plan: Plan) -> dict[str, list[str]]:
    return {layer.name: layer.offloaded for layer in plan.layers if layer.offloaded}


def _kinds_offloaded(plan: Plan) -> set[str]:
    return {param_kind(layer.name, p, layer.params[p].kind) for layer in plan.layers for p in layer.offloaded}


# ---------------------------------------------------------------------------
# selection by kind


def test_kinds_select_routed_experts_without_router_attention_or_norms(mixtral):
    plan = planner.plan(mixtral, kinds=[ROUTED])
    off = _offloaded(plan)
    assert off and all(len(p) == 24 and all(".experts." in n for n in p) for p in off.values())
    assert plan.summary.peak_gpu_bytes <= 40 * 2**30
    # the plan says what each param is, and round-trips
    layer = plan.layer("model.layers.31")
    assert layer.params["block_sparse_moe.gate.weight"].kind == "router"
    assert layer.params["block_sparse_moe.experts.5.w2.weight"].kind == ROUTED
    assert layer.params["input_layernorm.weight"].kind == "norm"
    assert plan.layer("lm_head").params["weight"].kind == "embedding"
    assert load_model(Plan, "<p>", dump_model(plan)) == plan
    assert any("of kind routed_experts" in n for n in plan.summary.notes)
    # the same as the file's segment selection, which records no kinds
    by_segment = planner.plan(load_spec(EXAMPLES / "mixtral-8x7b.yaml"))
    assert _offloaded(by_segment) == off and "kind:" not in dump_model(by_segment)


def test_qwen_moe_routed_shared_and_gates_apart():
    spec = qwen_moe()
    total = sum(layer.nbytes for layer in spec.model.expanded())
    routed = planner.plan(spec, kinds=[ROUTED], gpu_budget=total // 2, backend="uva")
    assert _kinds_offloaded(routed) == {ROUTED}
    # routed experts move param by param (auto's units are as fine as the params: a layer's experts in parts)
    assert all(all(n.startswith("mlp.experts.") for n in p) and 0 < len(p) <= 12 for p in _offloaded(routed).values())
    assert routed.summary.peak_gpu_bytes <= total // 2
    shared = planner.plan(spec, kinds=["shared_experts"], gpu_budget=total - 1, backend="uva")
    assert {n for p in _offloaded(shared).values() for n in p} == {
        "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight"}
    router = planner.plan(spec, kinds=["router"], gpu_budget=total - 1, backend="uva")
    assert {n for p in _offloaded(router).values() for n in p} == {"mlp.gate.weight", "mlp.shared_expert_gate.weight"}


def test_kinds_and_segments_intersect():
    spec = qwen_moe(offload={"kinds": [ROUTED, "shared_experts"], "params": ["down_proj"], "backend": "uva",
                             "strategy": "budget"})  # its notes name the selection
    with pytest.raises(InfeasibleError) as err:
        planner.plan(spec, gpu_budget=1)
    plan = planner.plan(spec, gpu_budget=err.value.min_gpu_budget)
    names = {n for p in _offloaded(plan).values() for n in p}
    assert names == {f"mlp.experts.{e}.down_proj.weight" for e in range(4)} | {"mlp.shared_expert.down_proj.weight"}
    assert plan.summary.offloaded_layers == 8
    assert "of kind routed_experts, shared_experts matching down_proj" in plan.summary.notes[0]


def test_fp8_scales_stay_unless_selected():
    spec = deepseek_like()
    total = sum(layer.nbytes for layer in spec.model.expanded())
    plan = planner.plan(spec, kinds=[ROUTED], gpu_budget=total // 2, backend="uva")
    names = {n for p in _offloaded(plan).values() for n in p}
    assert names and all(n.startswith("mlp.experts.") and n.endswith(".weight") for n in names)
    assert "model.layers.0" not in _offloaded(plan)  # dense: no routed experts
    # the expert scales too: kind scale, limited to the experts by a segment
    with pytest.raises(InfeasibleError) as err:  # the budget that takes every eligible param
        planner.plan(spec, kinds=[ROUTED, "scale"], params=["experts"], gpu_budget=1, backend="uva")
    with_scales = planner.plan(spec, kinds=[ROUTED, "scale"], params=["experts"],
                               gpu_budget=err.value.min_gpu_budget, backend="uva")
    names = {n for p in _offloaded(with_scales).values() for n in p}
    assert {n for n in names if n.endswith("weight_scale_inv")} == {
        f"mlp.experts.{e}.{w}.weight_scale_inv" for e in range(4) for w in ("gate_proj", "up_proj", "down_proj")}
    assert all(n.startswith("mlp.experts.") for n in names)


def test_group_strategy_selects_by_kind():
    plan = planner.plan(qwen_moe(), kinds=[ROUTED], strategy="group", group_size=2)
    assert list(_offloaded(plan)) == [f"model.layers.{i}" for i in (1, 3, 5, 7)]
    assert _kinds_offloaded(plan) == {ROUTED}


# ---------------------------------------------------------------------------
# the budget search with prefer


def test_prefer_offloads_routed_experts_before_attention(mixtral):
    prefer = [ROUTED, "attention"]
    seen = set()
    total = sum(layer.nbytes for layer in mixtral.model.expanded())
    for budget in (80 * GB, 40 * GB, 12 * GB, 5 * GB, int(2.5 * GB), int(1.5 * GB)):
        plan = planner.plan(mixtral, gpu_budget=budget, prefer=prefer, strategy="budget", backend="uva")
        off = _offloaded(plan)
        assert plan.summary.peak_gpu_bytes <= budget < total
        kinds = _kinds_offloaded(plan)
        seen.add(frozenset(kinds))
        assert kinds <= {ROUTED, "attention"}
        experts_per_layer = {name: sum(".experts." in p for p in params) for name, params in off.items()}
        stack = [f"model.layers.{i}" for i in range(32)]
        if "attention" in kinds:  # attention only once every layer's routed experts are gone
            assert all(experts_per_layer.get(name) == 24 for name in stack)
            with_attention = [stack.index(n) for n, p in off.items() if "self_attn.q_proj.weight" in p]
            assert with_attention == sorted(last_first(32)[:len(with_attention)])
            assert any(f"then attention of {len(with_attention)} of the 32" in n for n in plan.summary.notes)
        else:
            assert [stack.index(n) for n in off] == sorted(last_first(32)[:len(off)])
            assert all(v == 24 for v in experts_per_layer.values())
    assert seen == {frozenset({ROUTED}), frozenset({ROUTED, "attention"})}


def test_prefer_with_unlisted_kinds_last_and_missing_kinds_noted():
    spec = qwen_moe(offload={"prefer": ["shared_experts", ROUTED, "scale"], "backend": "uva", "strategy": "budget"})
    total = sum(layer.nbytes for layer in spec.model.expanded())
    plan = planner.plan(spec, gpu_budget=total // 3)
    assert _kinds_offloaded(plan) >= {"shared_experts", ROUTED}
    notes = " ".join(plan.summary.notes)
    assert "no eligible block-stack param is of kind scale" in notes
    assert "the other kinds (attention, norm, router)" in notes
    with pytest.raises(InfeasibleError) as err:
        planner.plan(spec, gpu_budget=1)
    tight = planner.plan(spec, gpu_budget=err.value.min_gpu_budget)
    assert _kinds_offloaded(tight) == {"shared_experts", ROUTED, "attention", "norm", "router"}


def test_prefer_prefetch_pool_covers_mixed_layers():
    """Tier 2 offloads attention in some layers only: slots are shared by layers with different param sets."""
    spec = qwen_moe(offload={"prefer": [ROUTED, "attention"], "kinds": [ROUTED, "attention"],
                             "backend": "prefetch", "prefetch_step": 2, "strategy": "budget"})
    stack_bytes = sum(layer.nbytes for layer in spec.model.expanded())
    plan = None
    for fraction in range(60, 0, -1):  # find a budget that offloads attention in some but not all layers
        try:
            plan = planner.plan(spec, gpu_budget=stack_bytes * fraction // 100)
        except InfeasibleError:
            break
        attn = [n for n, p in _offloaded(plan).items() if "self_attn.o_proj.weight" in p]
        if 0 < len(attn) < 8:
            break
    assert plan is not None and 0 < len(attn) < 8
    pool = plan.buffer_pool
    keys = {(k.param, tuple(k.shape), k.dtype): set(k.slots) for k in pool.keys}
    used: dict = {}
    for layer in plan.layers:
        for p in layer.offloaded:
            key = (p, tuple(layer.params[p].shape), layer.params[p].dtype)
            assert layer.prefetch.slot in keys[key]
            used.setdefault(key, set()).add(layer.prefetch.slot)
    assert used == keys  # no buffer that no layer uses
    assert pool.bytes == sum(k.bytes * len(k.slots) for k in pool.keys) == plan.summary.buffer_bytes
    assert plan.summary.peak_gpu_bytes <= plan.summary.gpu_budget_bytes


KIND_PARAMS = {
    "attention": ("self_attn.q_proj.weight", "self_attn.o_proj.weight"),
    "dense_mlp": ("mlp.down_proj.weight",),
    "shared_experts": ("mlp.shared_experts.up_proj.weight",),
    ROUTED: ("mlp.experts.0.w1.weight", "mlp.experts.1.w1.weight", "mlp.experts.w2"),
    "router": ("mlp.gate.weight",),
    "norm": ("input_layernorm.weight",),
    "scale": ("mlp.experts.0.w1.weight_scale_inv",),
}


@st.composite
def moe_specs(draw):
    num = draw(st.integers(1, 12))
    pool = [p for names in KIND_PARAMS.values() for p in names]
    template = {p: [draw(st.integers(1, 48)), 4] for p in draw(st.sets(st.sampled_from(pool), min_size=1))}
    blocks = [template if draw(st.booleans()) else
              {p: [draw(st.integers(1, 48)), 4] for p in sorted(draw(st.sets(st.sampled_from(pool), min_size=1)))}
              for _ in range(num)]
    layers = [{"name": "embed", "params": {"weight": [8, 4]}}]
    layers += [{"name": f"model.layers.{i}", "params": b} for i, b in enumerate(blocks)]
    kinds = draw(st.none() | st.lists(st.sampled_from(sorted(KIND_PARAMS)), min_size=1, max_size=4, unique=True))
    prefer = draw(st.lists(st.sampled_from(kinds or sorted(KIND_PARAMS)), min_size=1, max_size=3, unique=True))
    offload = {"backend": draw(st.sampled_from(["auto", "prefetch", "uva"])), "prefer": prefer, "strategy": "budget"}
    if kinds is not None:
        offload["kinds"] = kinds
    if draw(st.booleans()):
        offload["prefetch_step"] = draw(st.integers(1, 3))
    return _spec(layers, offload, dtype="float32")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(moe_specs(), st.floats(0.25, 1.1))
def test_prefer_plans_fit_keep_the_order_and_are_minimal(spec, fraction):
    from planner.build import _ladder, _merge, _model
    from planner.strategy.budget import _Path, peak_at

    total = sum(layer.nbytes for layer in spec.model.expanded())
    budget = max(1, int(total * fraction))
    plan = plan_within(spec, budget)  # None: infeasible, and the reported minimum is exact
    if plan is None:
        return
    s = plan.summary
    assert s.peak_gpu_bytes <= budget and s.resident_bytes + s.offloaded_bytes == total
    if total <= budget:
        assert s.offloaded_layers == 0
        return
    m = _model(spec, *_merge(spec, {}, {}))
    offload = spec.offload
    rank = {k: i for i, k in enumerate(offload.prefer)}
    stack = [layer for layer in spec.model.expanded() if layer.name.startswith("model.layers.")]
    eligible = {(layer.name, t.name): param_kind(layer.name, t.name) for layer in stack for t in layer.params
                if offload.kinds is None or param_kind(layer.name, t.name) in offload.kinds}
    off = {(layer.name, p) for layer in plan.layers for p in layer.offloaded}
    assert off <= set(eligible)
    # the order: a param of a later kind moves only once every eligible param of the earlier kinds has
    top = max(rank.get(eligible[x], len(rank)) for x in off)
    assert all(x in off for x, k in eligible.items() if rank.get(k, len(rank)) < top)
    assert not any(rank.get(eligible[x], len(rank)) > top for x in off)
    # even spread within the tier, ending at the last layer holding it
    ladder = _ladder(m)
    tier = next(i for i, tr in enumerate(ladder.tiers) if rank.get(tr.kinds[0], len(rank)) == top)
    of_tier = {layer.name: [x for x in eligible if x[0] == layer.name and rank.get(eligible[x], len(rank)) == top]
               for layer in stack}
    holders = [name for name, params in of_tier.items() if params]
    moved = [name for name in holders if any(x in off for x in of_tier[name])]
    assert [holders.index(n) for n in moved] == sorted(last_first(len(holders))[:len(moved)])
    assert all(all(x in off for x in of_tier[name]) for name in moved)
    # minimal: one step down the ladder (same backend) does not fit, unless this step is one that beats it
    # (planner/strategy/fit.py: a later step that fits the earlier one's peak and predicts a faster step is taken
    # instead; a prefetch step moving more can peak lower, its buffers sized by other layers); with backend auto a
    # UVA plan offloads at least what the lowest-peak prefetch plan does (stable as the budget grows), so it may
    # not be minimal
    count = sum(len(t.members) for t in ladder.tiers[:tier]) + len(moved)  # ladder steps taken
    if count > 0 and not (offload.backend == "auto" and s.backend == "uva"):
        fewer = peak_at(m.layers, ladder, count - 1, base=s.backend, forced={}, total_bytes=m.total_bytes,
                        slots=m.step)
        if fewer <= budget:  # e.g. a toy at 768 bytes: 8 steps peak 736 at 1.2126 ms, 9 steps 640 at 1.2090
            path = _Path(m.layers, ladder, s.backend, {}, m.total_bytes, m.step)
            assert s.peak_gpu_bytes <= fewer and path.step_ms(count, m.cost) < path.step_ms(count - 1, m.cost)
    if s.backend == "prefetch":  # the step given, else double buffering
        assert s.prefetch_step == (offload.prefetch_step or 2)
        assert plan.buffer_pool.slots == min(s.offloaded_layers, s.prefetch_step)


def test_prefer_plans_are_deterministic_across_processes(mixtral, tmp_path):
    path = tmp_path / "mixtral.yaml"
    path.write_text(dump_model(mixtral))
    code = ("import sys, planner, schemas; s = schemas.load_spec(sys.argv[1]); sys.stdout.write(schemas.dump_model("
            "planner.plan(s, gpu_budget=3 * 10**9, prefer=['routed_experts', 'attention'])))")
    outs = {subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                           text=True, check=True,
                           env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))).stdout
            for seed in ("1", "2", "3")}
    assert len(outs) == 1
    text = outs.pop()
    assert "kind: routed_experts" in text and "self_attn.q_proj.weight" in text
    assert "then attention of" in text


# ---------------------------------------------------------------------------
# bad input


def test_bad_kind_settings_are_validation_errors():
    spec = qwen_moe()
    with pytest.raises(ValidationError, match="strategy 'group'"):
        planner.plan(spec, prefer=[ROUTED], strategy="group", group_size=2)
    with pytest.raises(ValidationError, match="prefer names attention, which kinds leaves out"):
        planner.plan(spec, kinds=[ROUTED], prefer=[ROUTED, "attention"])
    with pytest.raises(ValidationError, match="more than once"):
        planner.plan(spec, kinds=[ROUTED, ROUTED])
    with pytest.raises(ValidationError, match="empty"):
        planner.plan(spec, prefer=[])


MOE = qwen_moe(num_layers=2).model_dump(mode="json", exclude_none=True)
del MOE["offload"]["strategy"]  # as a written spec leaves it: the default (auto, with or without --prefer)
MOE_TEXT = yaml.safe_dump(MOE, sort_keys=False)


def _moe_text_with(offload: dict | None = None, param_kind: str | None = None) -> str:
    data = copy.deepcopy(MOE)
    if offload:
        data["offload"] |= offload
    if param_kind:
        data["model"]["layers"][1]["params"]["mlp.shared_expert_gate.weight"]["kind"] = param_kind
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize(("text", "args", "expect"), [
    (MOE_TEXT, ("--kinds", "routed_expert"), ("kinds[0]", "did you mean 'routed_experts'")),
    (MOE_TEXT, ("--prefer", "routed_experts,atention"), ("prefer[1]", "did you mean 'attention'")),
    (MOE_TEXT, ("--prefer", "routed_experts", "--strategy", "group", "--group-size", "2"), ("strategy 'group'",)),
    (MOE_TEXT, ("--kinds", "router", "--prefer", "norm"), ("prefer names norm",)),
    (_moe_text_with({"kinds": ["shared_expert"]}), (),
     ("bad.yaml:", "offload.kinds[0]", "did you mean 'shared_experts'")),
    (_moe_text_with(param_kind="dense_mpl"), (),
     ("bad.yaml:", "params['mlp.shared_expert_gate.weight'].kind", "did you mean 'dense_mlp'")),
])
def test_cli_bad_kinds_exit_2_with_a_suggestion(tmp_path, text, args, expect):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = invoke("plan", str(path), "-g", "1MB", *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for piece in expect:
        assert piece in result.stderr, result.stderr


def test_cli_kinds_and_prefer_plan(tmp_path):
    path = tmp_path / "moe.yaml"
    path.write_text(MOE_TEXT)
    total = sum(layer.nbytes for layer in qwen_moe(num_layers=2).model.expanded())
    result = invoke("plan", str(path), "-g", str(total // 2), "--kinds", "routed_experts, shared_experts",
                    "--prefer", "shared_experts,routed_experts", "--backend", "uva", "--strategy", "budget")
    assert result.exit_code == 0, result.output
    plan = load_model(Plan, "<out>", result.stdout)
    assert _kinds_offloaded(plan) <= {"shared_experts", ROUTED} and plan.summary.peak_gpu_bytes <= total // 2
    assert "budget by kind (shared_experts, then routed_experts" in plan.summary.notes[0]


@pytest.mark.parametrize("experts", [64, 100])  # 256 would be legal: 128 an equal share (a rank's)
def test_a_plan_whose_moe_contradicts_its_expert_tensors_is_refused_at_load(tmp_path, experts):
    """A hand-edited ``moe.experts`` would make every prediction price another count of experts: the plan check
    (schemas/plan_check.py) refuses it with the file, line and field, as the spec's graph does (schemas.kinds)."""
    from schemas.errors import InputError
    from schemas.io import load_plan

    spec = load_spec(EXAMPLES / "generated" / "qwen3-30b-a3b.yaml")
    plan = planner.plan(spec, gpu_budget=20 * 10**9)
    good = tmp_path / "good.plan.yaml"
    good.write_text(dump_model(plan))
    load_plan(good)
    text = good.read_text()
    assert "moe: {experts: 128, top_k: 8}" in text
    bad = tmp_path / "bad.plan.yaml"
    bad.write_text(text.replace("moe: {experts: 128, top_k: 8}", f"moe: {{experts: {experts}, top_k: 8}}", 1))
    with pytest.raises(InputError) as err:
        load_plan(bad)
    message = str(err.value)
    assert "bad.plan.yaml" in message and ".moe" in message
    assert "holds 128 experts" in message and f"moe.experts is {experts}" in message
