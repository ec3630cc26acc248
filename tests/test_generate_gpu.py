"""Generation as users run it, on an offloaded model, under every capture they meet (issue 17):
transformers' static-cache ``generate()`` (which compiles the decode step with CUDA-graph trees),
``torch.compile(mode="reduce-overhead")`` on a forward loop, also with a graph break that cuts each
forward into several graphs (copies then cross a graph boundary), ``torch.compile`` without graphs,
manual ``torch.cuda.graph`` capture, and the dynamic cache; for a prefetch, a UVA and a mixed plan.
Each is compared with the same model unoffloaded, run the same way. Skipped without CUDA."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

import planner  # noqa: E402
import runtime  # noqa: E402
from models import LlamaConfig, make_llama  # noqa: E402

NEW_TOKENS = 12


def tiny_causal_lm():
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM

    config = HFConfig(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.05)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def plans(spec):
    """A prefetch, a UVA and a mixed plan (wrap-around copies: the first blocks' copies cross the end of a
    forward), each offloading most blocks."""
    return {
        "prefetch": planner.plan(spec, strategy="group", group_size=1, num_in_group=1, prefetch_step=2,
                                 backend="prefetch"),
        "uva": planner.plan(spec, strategy="group", group_size=2, num_in_group=1, backend="uva"),
        "mixed": planner.plan(spec, strategy="group", group_size=1, num_in_group=1, prefetch_step=2,
                              backend="prefetch", backends={"attention": "uva"}),
    }


def _generate(model, ids, cache: str):
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=0, eos_token_id=None, cache_implementation=cache)
    return out[0, ids.shape[1]:].tolist()


@pytest.fixture(scope="module")
def lm():
    # inductor fuses across the layer boundaries where the offload ops sit unless it rounds as eager does
    torch._inductor.config.emulate_precision_casts = True
    base = tiny_causal_lm()
    ids = torch.randint(0, 500, (1, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    ref = copy.deepcopy(base).cuda()
    torch._dynamo.reset()
    want = {cache: _generate(ref, ids, cache) for cache in ("static", "dynamic")}
    del ref
    torch._dynamo.reset()
    yield base, ids, want, plans(runtime.describe(base, name="tiny-llama"))
    torch._inductor.config.emulate_precision_casts = False


@pytest.mark.parametrize("which", ["prefetch", "uva", "mixed"])
@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_generate_same_tokens(lm, which, cache):
    base, ids, want, made = lm
    model = copy.deepcopy(base)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with runtime.apply(made[which], model, "cuda"):
        assert model.device.type == "cuda"
        got = _generate(model, ids, cache)
        again = _generate(model, ids, cache)  # graphs recorded by the first call, replayed now
    assert got == want[cache]
    assert again == want[cache]
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def _forward_loop(model, ids, steps=4):
    outs = []
    with torch.no_grad():
        for k in range(steps):
            outs.append(model((ids + k) % 500).clone())
    return outs


def _graph_break_at(model, layer: int):
    """A pre-hook that breaks dynamo's graph before ``layer``: each forward becomes two compiled regions."""
    return model.model.layers[layer].register_forward_pre_hook(lambda *_: torch._dynamo.graph_break())


@pytest.mark.parametrize("which", ["prefetch", "uva", "mixed"])
@pytest.mark.parametrize("mode,split", [("reduce-overhead", False), ("reduce-overhead", True), ("default", False)])
def test_compiled_forward_loop(which, mode, split):
    """``torch.compile(model, mode=...)`` on a plain forward loop equals the unoffloaded model compiled the
    same way; with ``split`` a graph break cuts each forward in two graphs, so copies issued in the first
    are used in the second (and the wrap-around copies cross the end of the second)."""
    torch._inductor.config.emulate_precision_casts = True
    try:
        base = make_llama(LlamaConfig(vocab=512, dim=256, layers=10, heads=4, kv_heads=2, hidden=704))
        ids = torch.randint(0, 500, (2, 8), device="cuda")
        ref = copy.deepcopy(base).cuda()
        breaks = _graph_break_at(ref, 5) if split else None
        torch._dynamo.reset()
        want = _forward_loop(torch.compile(ref, mode=mode), ids)
        del ref, breaks
        plan = plans(runtime.describe(base, name="llama-10"))[which]
        with runtime.apply(plan, base, "cuda") as handle:
            if split:
                _graph_break_at(base, 5)
            got = _forward_loop(torch.compile(base, mode=mode), ids)
            assert handle.offloader.name == which
        for a, b in zip(got, want):
            assert torch.equal(a, b), (a.float() - b.float()).abs().max().item()
    finally:
        torch._inductor.config.emulate_precision_casts = False
        torch._dynamo.reset()


@pytest.mark.parametrize("which", ["prefetch", "mixed"])
def test_manual_graph_capture_of_a_causal_lm(lm, which):
    """``torch.cuda.graph`` around a transformers forward (use_cache=False) on a prefetch and a mixed plan."""
    base, ids, _want, made = lm
    ref = copy.deepcopy(base).cuda()
    with torch.no_grad():
        want = ref(ids, use_cache=False).logits
    del ref
    model = copy.deepcopy(base)
    with runtime.apply(made[which], model, "cuda"), torch.no_grad():
        static = ids.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model(static, use_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static, use_cache=False).logits
        for _ in range(3):
            graph.replay()
            assert torch.equal(out, want)
        del graph
