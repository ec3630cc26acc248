"""Offloaded tensors are read-only while a plan is applied: a write is refused or found, never lost.

A gpt-fast-style model writes its KV cache (a registered buffer) in forward. Planned with any
strategy and applied with any backend, the outcome is exact outputs (caches resident), a refusal
at apply (a plan offloading buffers, nothing moved), or, when the caller vouches wrongly that
buffers are read-only, OffloadedWriteError instead of the output; ``remove()`` then restores the
host copies (prefetched tensors the values from before the write: bit-identical) and warns.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
from conftest import weights_only

torch = pytest.importorskip("torch")

import planner  # noqa: E402
import runtime  # noqa: E402
from kv_model import generate, make_kv_decoder  # noqa: E402
from model_state import assert_same, differences, snapshot  # noqa: E402
from models import LlamaConfig, make_llama  # noqa: E402
from runtime.errors import OffloadedWriteError  # noqa: E402

PROMPT = torch.randint(0, 60, (1, 4), generator=torch.Generator().manual_seed(1))
WEIGHTS = ["wqkv", "wo", "feed_forward", "tok_embeddings", "output"]  # every param, no cache


def _weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_plan(model, how: str, device: str = "cpu", params: list[str] | None = None):
    spec = weights_only(runtime.describe(model))  # a toy: its budget is about weights
    if how.startswith("group-"):
        return planner.plan(spec, strategy="group", group_size=2, num_in_group=1, prefetch_step=1,
                            backend=how.removeprefix("group-"), params=params)
    return planner.plan(spec, strategy=how, gpu_budget=_weight_bytes(model) // 2, params=params)


PLANS = ["group-prefetch", "group-uva", "auto", "budget"]


@pytest.mark.parametrize("how", PLANS)
def test_an_offloaded_kv_cache_is_refused_not_silently_wrong(how):
    model = make_kv_decoder()
    plan = kv_plan(model, how)
    offloaded = {f"{layer.name}.{r}" for layer in plan.layers for r in layer.offloaded}
    assert any("k_cache" in name for name in offloaded)  # the planner cannot know the caches are written
    snap = snapshot(model)
    with pytest.raises(runtime.PlanMismatchError, match=r"offloads \d+ registered buffers .*k_cache.*read_only_buffers"):
        runtime.apply(plan, model, device="cpu")
    assert_same(model, snap)  # refused before anything moved
    # a caller who vouches wrongly that the buffers are read-only: the first forward finds the write
    h = runtime.apply(plan, model, device="cpu", read_only_buffers=True)
    for _ in range(2):  # the prefill writes; every later forward is refused too
        with pytest.raises(OffloadedWriteError, match="k_cache") as err:
            generate(model, PROMPT, 3)
        assert "read-only" in str(err.value) and "offload.params" in str(err.value)
        assert set(err.value.written) <= offloaded and any("v_cache" in n for n in err.value.written)
    with pytest.warns(RuntimeWarning, match="wrote to .* offloaded tensor"):
        h.remove()
    changed = {p.partition(":")[0] for p in differences(model, snap, same_storage=False)}
    # prefetched tensors come back bit-identical; a write read through UVA landed in the host copy;
    # resident caches hold their writes, as they would without a plan
    assert changed == {n for n in changed if "cache" in n} and not changed & _prefetched(plan), changed


def _prefetched(plan) -> set[str]:
    return {f"{layer.name}.{r}" for layer in plan.layers if layer.prefetch is not None for r in layer.prefetched}


@pytest.mark.parametrize("how", PLANS)
def test_with_the_caches_resident_every_plan_is_exact(how):
    model, reference = make_kv_decoder(), make_kv_decoder()
    want = generate(reference, PROMPT, 4)
    plan = kv_plan(model, how, params=WEIGHTS)
    assert not any("cache" in r for layer in plan.layers for r in layer.offloaded)
    assert any(layer.offloaded for layer in plan.layers)
    with runtime.apply(plan, model, device="cpu"):
        got = generate(model, PROMPT, 4)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))


CFG = LlamaConfig(vocab=64, dim=32, layers=4, heads=4, kv_heads=2, hidden=48)
IDS = torch.randint(0, 60, (2, 5), generator=torch.Generator().manual_seed(2))


def _index(w):
    w[0, 0] = 1.0


def _view(w):
    w[1].add_(1.0)


def _out(w):
    torch.mul(w, 2.0, out=w)


def _index_copy(w):
    w.index_copy_(0, torch.tensor([0]), torch.ones(1, w.shape[1], dtype=w.dtype))


def _inference(w):
    with torch.inference_mode():
        w.zero_()


WRITES = {"index": _index, "view": _view, "out=": _out, "index_copy_": _index_copy, "inference_mode": _inference}


@lru_cache(maxsize=None)
def _llama_plan(backend: str):
    return planner.plan(runtime.describe(make_llama(CFG)), strategy="group", group_size=2, num_in_group=1,
                        prefetch_step=1, backend=backend)


# every kind of write once in a forward under prefetch; the other backend and between forwards for some
CASES = [(kind, "prefetch", "in forward") for kind in WRITES] + [
    ("index", "uva", "in forward"), ("view", "uva", "between forwards"), ("inference_mode", "prefetch", "between forwards")]


@pytest.mark.parametrize("kind,backend,when", CASES, ids=["-".join(c) for c in CASES])
def test_every_kind_of_write_is_found(backend, kind, when):
    model = make_llama(CFG)
    plan = _llama_plan(backend)
    snap = snapshot(model)
    h = runtime.apply(plan, model, device="cpu")
    with torch.no_grad():
        model(IDS)  # reading is fine
        block = model.model.layers[1]  # offloaded by the plan
        w = block.mlp.up_proj.weight
        if when == "in forward":
            hook = block.register_forward_pre_hook(lambda *_: WRITES[kind](w))
        else:
            WRITES[kind](w)
        with pytest.raises(OffloadedWriteError, match=r"model\.layers\.1\.mlp\.up_proj\.weight \(param"):
            model(IDS)
        if when == "in forward":
            hook.remove()
    with pytest.warns(RuntimeWarning):
        h.remove()
    if backend == "prefetch":  # the write went to a slot: the true values are untouched
        assert_same(model, snap, same_storage=False)


def test_the_check_is_traced_away_under_compile_and_reads_are_exact():
    model, reference = make_kv_decoder(layers=2), make_kv_decoder(layers=2)
    with torch.no_grad():
        want = reference(PROMPT, torch.arange(4))
    plan = planner.plan(runtime.describe(model), strategy="group", group_size=2, num_in_group=1, backend="prefetch",
                        params=WEIGHTS)
    assert plan.layers[2].offloaded  # layers.1
    with runtime.apply(plan, model, device="cpu"):
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # the hook adds no graph break
        with torch.no_grad():
            assert torch.equal(compiled(PROMPT, torch.arange(4)), want)


# -- on the GPU (the lead runs these on an H200) ---------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("how", PLANS)
@pytest.mark.parametrize("resident", [False, True], ids=["caches planned", "caches resident"])
@pytest.mark.parametrize("origin", ["cpu", "cuda"])
def test_on_cuda_a_kv_cache_model_is_exact_or_refused(how, resident, origin):
    model, reference = make_kv_decoder(device=origin), make_kv_decoder(device="cuda")
    prompt = PROMPT.to("cuda")
    want = generate(reference, prompt, 4)
    snap = snapshot(model)
    plan = kv_plan(model, how, params=WEIGHTS if resident else None)
    if not resident:
        with pytest.raises(runtime.PlanMismatchError, match="registered buffers"):
            runtime.apply(plan, model, device="cuda")
        assert not differences(model, snap)
    h = runtime.apply(plan, model, device="cuda", read_only_buffers=not resident)
    if resident:
        got = generate(model, prompt, 4)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        h.remove()
        return
    with pytest.raises(OffloadedWriteError, match="k_cache"):
        generate(model, prompt, 4)
    with pytest.warns(RuntimeWarning):
        h.remove()
    changed = {p.partition(":")[0] for p in differences(model, snap, same_storage=False)}
    assert changed == {n for n in changed if "cache" in n} and not changed & _prefetched(plan), changed
