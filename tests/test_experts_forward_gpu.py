"""Experts read through UVA in tall tiles, on a GPU (runtime/experts_forward.py): a prefill whose calls the runtime pads
gives the resident model's logits bit for bit, as the decode steps that keep the module's forward do. Skipped
without CUDA; the logic around it is tested on the CPU (tests/test_experts_forward.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("shape", [(1, 512), (4, 1)])  # 2,048 pairs over 16 experts (padded); a decode step
def test_uva_experts_give_the_resident_logits(shape, monkeypatch):
    import runtime
    import runtime.experts_forward as ue
    from moe_models import make_moe
    from test_experts_forward import _uva_plan

    model = make_moe("qwen3_moe", implementation="grouped_mm").cuda()
    ids = torch.randint(0, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(3)).cuda()
    with torch.no_grad():
        want = model(ids).logits
    taken = []
    spy = ue.tall_tiles_apply
    monkeypatch.setattr(ue, "tall_tiles_apply", lambda *a: taken.append(spy(*a)) or taken[-1])
    with runtime.apply(_uva_plan(model), model, device="cuda"):
        with torch.no_grad():
            got = model(ids).logits
    assert taken and all(taken) == (shape[1] == 512)
    assert torch.equal(got, want)


def test_compiled_prefill_gives_the_resident_compiled_logits(monkeypatch):
    """Under torch.compile (reduce-overhead: inductor, then CUDA graphs) a prefill the tall tiles would take runs the
    module's own forward: the logits are the resident model's compiled ones bit for bit (through the padded path
    they were not: this test failed before runtime/experts_forward.py kept the module's forward while compiling)."""
    import runtime
    from moe_models import make_moe
    from test_experts_forward import _uva_plan

    monkeypatch.setattr(torch._inductor.config, "emulate_precision_casts", True)
    model = make_moe("qwen3_moe", implementation="grouped_mm").cuda()
    ids = torch.randint(0, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(3)).cuda()

    def compiled_logits() -> torch.Tensor:
        torch._dynamo.reset()
        step = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(3):  # the third call replays the recorded graph
                logits = step(ids, use_cache=False).logits.clone()
        torch._dynamo.reset()
        return logits

    want = compiled_logits()
    with runtime.apply(_uva_plan(model), model, device="cuda"):
        got = compiled_logits()
    assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "olmoe"])
def test_eager_decode_calls_of_experts_modules_replay_graphs_bit_for_bit(arch):
    """runtime/shape_graphs.py for experts modules not split, some read through UVA and the others resident: what
    tests/layer_graphs_check.py's ``check_layer_graphs`` holds (the launched plan's and the resident model's logits
    bit for bit, one graph a shape a module, none under autograd, whole-model capture and generate() as without the
    graphs)."""
    from layer_graphs_check import check_layer_graphs
    from moe_models import make_moe
    from test_experts_forward import _forwards, _half_plan

    model = make_moe(arch, implementation="grouped_mm").cuda()
    check_layer_graphs(model, _half_plan(model), lambda handle: _forwards(model))
