"""`plan --from-vllm` as vLLM really runs the flags (planner/vllm/): the order its --cpu-offload-gb walk follows,
the pool its prefetch offloader allocates, and the slots it never refills. Each expected value is worked out
by hand from vLLM's code, quoted (short lines, with the file; read at planner.vllm.select.VLLM_READ).
"""

from __future__ import annotations

import copy

import pytest
from cli_samples import invoke
from conftest import EXAMPLES

from planner.errors import InfeasibleError, PlanningError
from planner.vllm.flags import parse_vllm_flags
from planner.vllm.plan import from_vllm
from planner.vllm.select import VLLM_READ
from schemas.spec import SpecFile
from schemas.io import dump_model, load_spec
from schemas.plan import Plan
from schemas.plan_check import plan_findings
from schemas.workload import Workload, WorkloadItem

LLAMA = EXAMPLES / "generated" / "llama-3-8b.yaml"
DEEPSEEK = EXAMPLES / "generated" / "deepseek-v2-lite.yaml"  # layer 0 dense, layers 1-26 MoE


def plan_of(spec, flags: str, **kw) -> Plan:
    return from_vllm(spec if isinstance(spec, SpecFile) else load_spec(spec), parse_vllm_flags(flags), **kw)


def key_bytes(plan: Plan) -> int:
    return sum(k.bytes for k in plan.buffer_pool.keys)


# --- the pool: every key in every slot --------------------------------------------------------------------
# vllm/model_executor/offloader/prefetch.py, PrefetchOffloader.post_init:
#     self.buffer_pool = StaticBufferPool(param_infos=param_infos, slot_capacity=self.prefetch_step, ...)
# and StaticBufferPool.__init__, for every unique (name, shape, stride, dtype) key:
#     for _ in range(slot_capacity):
#         ...
#         self.total_bytes += info.num_bytes


def test_the_pool_holds_every_key_in_each_of_the_step_slots_and_the_peak_counts_it():
    plan = plan_of(LLAMA, "--offload-group-size 8 --offload-num-in-group 2 --offload-prefetch-step 2")
    pool = plan.buffer_pool
    assert pool.every_slot and pool.slots == 2 and all(k.slots == [0, 1] for k in pool.keys)
    assert pool.bytes == 2 * key_bytes(plan)
    s = plan.summary
    others = plan.memory.non_weight_bytes  # the KV cache, activations and workspace the plan counts too
    assert s.peak_gpu_bytes == s.resident_bytes + pool.bytes + others and not plan_findings(plan)
    assert any(VLLM_READ in note for note in s.notes)


def test_fewer_offloaded_layers_than_slots_still_get_every_slot():
    # 32 decoder layers, group 16 / 1: layers 15 and 31; 4 slots: vLLM allocates all 4, two never used
    flags = "--offload-group-size 16 --offload-num-in-group 1 --offload-prefetch-step 4"
    plan = plan_of(LLAMA, flags)
    layer = next(layer for layer in plan.layers if layer.prefetch is not None)
    assert plan.buffer_pool.slots == 4 and plan.buffer_pool.bytes == 4 * layer.offloaded_bytes
    s = plan.summary
    # a budget the old pool (one buffer per slot used: 2 layers) fitted, vLLM's 4 slots do not
    old_peak = s.resident_bytes + 2 * layer.offloaded_bytes
    with pytest.raises(InfeasibleError, match=f"the smallest feasible gpu_budget for these flags is {s.peak_gpu_bytes}"):
        plan_of(LLAMA, flags, gpu_budget=old_peak)
    result = invoke("plan", str(LLAMA), "--from-vllm", flags, "--gpu-budget", str(old_peak))
    assert result.exit_code == 1, result.output
    assert plan_of(LLAMA, flags, gpu_budget=s.peak_gpu_bytes).summary.gpu_budget_bytes == s.peak_gpu_bytes


def test_layers_with_other_keys_share_no_slot_yet_get_buffers_in_all():
    # DeepSeek-V2-Lite: layer 0's dense MLP keys (gate_up_proj, down_proj) exist in no MoE layer; layer 0 takes
    # slot 0 only, and vLLM still gives its keys a buffer in slot 1
    plan = plan_of(DEEPSEEK, "--offload-group-size 1 --offload-num-in-group 1 --offload-prefetch-step 2")
    dense = [k for k in plan.buffer_pool.keys if k.param.startswith("mlp.") and "experts" not in k.param
             and "shared" not in k.param and "gate.weight" not in k.param]
    assert dense and all(k.slots == [0, 1] for k in dense)
    assert plan.buffer_pool.bytes == 2 * key_bytes(plan) and not plan_findings(plan)


# --- a slot holding one layer is filled once ----------------------------------------------------------------
# vllm/model_executor/offloader/runtime.py, PrefetchRuntimeController:
#     slot_idx=unit_idx % prefetch_step,
# and _build_prefetch_after, per slot:
#     if len(units_in_slot) <= 1:
#         continue
#     ... prefetch_after[unit.unit_idx] = units_in_slot[(index + 1) % len(units_in_slot)]
# (before it, prefetch.py refilled ``next_index = (index + self.prefetch_step) % len(self.module_offloaders)``)


def test_a_layer_alone_in_its_slot_is_copied_once_and_never_in_a_forward():
    # group 7 / 1 over 32 layers: 6, 13, 20, 27; 3 slots: slot 0 {6, 27}, slot 1 {13}, slot 2 {20}
    plan = plan_of(LLAMA, "--offload-group-size 7 --offload-num-in-group 1 --offload-prefetch-step 3")
    once = {layer.name: layer.prefetch.once for layer in plan.layers if layer.prefetch is not None}
    assert once == {"model.layers.6": False, "model.layers.13": True, "model.layers.20": True,
                    "model.layers.27": False}
    assert not plan_findings(plan)
    layer = next(layer for layer in plan.layers if layer.name == "model.layers.6")  # every block is the same size
    profile = plan.predictions.profile
    copy_ms = 2 * (layer.offloaded_bytes / profile.h2d_gbps / 1e6 + len(layer.offloaded) * profile.copy_call_us / 1e3)
    assert plan.predictions.workloads[0].copy_ms == pytest.approx(copy_ms, abs=2e-4)  # two layers copied, not four
    assert any("model.layers.{13,20}, alone in their slots, are copied once" in note for note in plan.summary.notes)


def test_with_every_layer_alone_the_step_is_the_resident_step():
    spec = load_spec(LLAMA)
    work = Workload({"decode": WorkloadItem(tokens=1), "prefill": WorkloadItem(tokens=2048)})
    plan = plan_of(spec, "--offload-group-size 16 --offload-num-in-group 1 --offload-prefetch-step 2", workload=work)
    resident = plan_of(spec, "--offload-group-size 0", workload=work)
    assert all(layer.prefetch.once for layer in plan.layers if layer.prefetch is not None)
    assert plan.predictions.weighted_step_ms == pytest.approx(resident.predictions.weighted_step_ms)


def test_the_plan_check_refuses_once_on_a_shared_slot():
    plan = plan_of(LLAMA, "--offload-group-size 7 --offload-num-in-group 1 --offload-prefetch-step 3")
    layers = [layer.model_copy(update={"prefetch": layer.prefetch.model_copy(update={"once": True})})
              if layer.name == "model.layers.6" else layer for layer in plan.layers]
    findings = plan_findings(plan.model_copy(update={"layers": layers}))
    assert ("once", True) in [(f.loc[-1], "slot 0 also holds 1 other" in f.text) for f in findings]
    assert "copy_ms" in [f.loc[-1] for f in findings]  # and its predictions no longer match its copies


def test_the_runtime_leaves_a_lone_layer_in_its_slot():
    torch = pytest.importorskip("torch")
    import runtime
    from models import LlamaConfig, make_llama

    model = make_llama(LlamaConfig(vocab=256, dim=64, layers=9, heads=4, kv_heads=2, hidden=160))
    spec = runtime.describe(model, name="tiny-llama")
    # group 3 / 1 over 9 layers: 2, 5, 8; 2 slots: slot 0 {2, 8}, slot 1 {5} (alone)
    plan = plan_of(spec, "--offload-group-size 3 --offload-num-in-group 1 --offload-prefetch-step 2")
    alone = [layer for layer in plan.layers if layer.prefetch is not None and layer.prefetch.once]
    assert [layer.name for layer in alone] == ["model.layers.5"]
    ids = torch.randint(0, 250, (2, 6), generator=torch.Generator().manual_seed(1))
    want = copy.deepcopy(model)(ids)
    with runtime.apply(plan, model, device="cpu", stats=True) as handle:
        for _ in range(3):
            assert torch.equal(model(ids), want)
        forwards = handle.stats()["forwards"]
    moved = plan.summary.offloaded_bytes - alone[0].offloaded_bytes  # model.layers.5 is never copied again
    assert all(f["bytes_copied"] == moved and f["late_copies"] == 0 for f in forwards[-2:])


def test_the_bench_s_group_7_1_step_3_copies_two_layers_a_forward_on_the_cpu():
    """bench_predict_h200's "vllm group 7/1 step 3" on 32 layers (6, 13, 20, 27; 3 slots: 13 and 20 alone in
    theirs): each forward copies 27 (before layer 7) and 6 (before layer 28, for the next forward), in that
    order, and nothing else: the H200 measured it as if four copies a forward, the runtime issues two."""
    torch = pytest.importorskip("torch")
    import runtime
    from models import LlamaConfig, make_llama

    model = make_llama(LlamaConfig(vocab=64, dim=16, layers=32, heads=2, kv_heads=1, hidden=32))
    spec = runtime.describe(model, name="tiny-llama")
    plan = plan_of(spec, "--offload-group-size 7 --offload-num-in-group 1 --offload-prefetch-step 3")
    prefetched = {layer.name: layer for layer in plan.layers if layer.prefetch is not None}
    assert {n: (p.prefetch.slot, p.prefetch.once) for n, p in prefetched.items()} == {
        "model.layers.6": (0, False), "model.layers.13": (1, True), "model.layers.20": (2, True),
        "model.layers.27": (0, False)}
    ids = torch.randint(0, 60, (1, 3), generator=torch.Generator().manual_seed(2))
    want = copy.deepcopy(model)(ids)
    with runtime.apply(plan, model, device="cpu", stats=True) as handle:
        for _ in range(3):
            assert torch.equal(model(ids), want)
        forwards = handle.offloader.forward_stats()
    layer_bytes = prefetched["model.layers.6"].offloaded_bytes
    for forward in forwards[-2:]:
        assert [name for name, *_ in forward.copies] == ["model.layers.27", "model.layers.6"]
        assert forward.bytes == 2 * layer_bytes and forward.late_copies == 0


# --- the order of --cpu-offload-gb ------------------------------------------------------------------------
# vllm/model_executor/offloader/uva.py, UVAOffloader._maybe_offload_to_cpu:
#     for name, p in module.named_parameters():
#         if self.cpu_offload_bytes >= self.cpu_offload_max_bytes:
#             ...
#             break
# named_parameters() lists a module's params in the order it registers them (its __init__), which a spec
# from describe() or --from-hf-config keeps and a spec from --from-safetensors does not (sorted by name).


def _reordered(param_order: str | None) -> SpecFile:
    """Llama-3-8B with each block's params listed MLP first (another module's registration order)."""
    data = load_spec(LLAMA).model_dump(exclude_none=True)
    block = next(layer for layer in data["model"]["layers"] if layer.get("repeat"))
    params = block["params"]
    block["params"] = {k: params[k] for k in sorted(params, key=lambda k: (not k.startswith("mlp."), k))}
    if param_order is not None:
        data["model"]["param_order"] = param_order
    return SpecFile.model_validate(data)


def test_the_walk_follows_the_order_the_spec_lists_the_params_in():
    # 0.5 GiB = 536,870,912 bytes: layer 0 whole (436,224,000 with its norms), then layer 1 from its first
    # listed param on, 100,646,912 bytes left: listed MLP first, down_proj (117,440,512) crosses the limit and
    # goes whole; listed as registered (attention first), q, k, v, o (83,886,080) and then vLLM's gate_up_proj
    # (q, k, v fused; gate and up fused in vLLM's modules: planner/vllm/layout.py)
    mlp_first = plan_of(_reordered(None), "--cpu-offload-gb 0.5")
    attention_first = plan_of(LLAMA, "--cpu-offload-gb 0.5")
    layer1 = {p.name: p for p in mlp_first.layers if p.name == "model.layers.1"}["model.layers.1"]
    assert layer1.offloaded == ["mlp.down_proj.weight"]
    first = next(layer for layer in attention_first.layers if layer.name == "model.layers.1")
    assert sorted(first.offloaded) == ["mlp.gate_proj.weight", "mlp.up_proj.weight", "self_attn.k_proj.weight",
                                       "self_attn.o_proj.weight", "self_attn.q_proj.weight", "self_attn.v_proj.weight"]


def test_a_spec_sorted_by_name_is_refused_where_the_limit_cuts_a_layer():
    named = _reordered("name")
    with pytest.raises(PlanningError, match=r"inside model\.layers\.1 .*param_order: name.*--cpu-offload-gb "
                                            r"0\.40626 \(up to the layer before it\) or 0\.81253 \(through it\)"):
        plan_of(named, "--cpu-offload-gb 0.5")
    for limit in ("0.40626", "0.81253"):  # at a layer boundary the order does not matter
        assert plan_of(named, f"--cpu-offload-gb {limit}").summary.offloaded_layers == (1 if limit == "0.40626" else 2)
    # prefetch takes whole layers (or --offload-params segments): the order never matters
    assert plan_of(named, "--offload-group-size 8 --offload-num-in-group 2").summary.offloaded_layers == 8


def test_the_refusal_is_a_clear_exit_2(tmp_path):
    path = tmp_path / "named.yaml"
    path.write_text(dump_model(_reordered("name")))
    result = invoke("plan", str(path), "--from-vllm", "--cpu-offload-gb 0.5")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "registers them" in result.output
