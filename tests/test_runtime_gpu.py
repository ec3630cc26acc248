"""The runtime on a CUDA GPU: bit-identical outputs in eager mode and CUDA graph replay,
bit-identical restore. Skipped without CUDA; bench/gpu_check.py covers torch.compile,
memory, leaks and speed on the device machine (results in docs/BENCHMARKS.md)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

import planner  # noqa: E402
import runtime  # noqa: E402
from models import LlamaConfig, make_llama  # noqa: E402

CFG = LlamaConfig(vocab=512, dim=256, layers=17, heads=4, kv_heads=2, hidden=704)


def graph_outputs(model, ids, n=3):
    static = ids.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            model(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model(static)
    outs = []
    for k in range(n):
        static.copy_((ids + k) % 500)
        graph.replay()
        outs.append(out.clone())
    return outs


def reference_outputs(base, ids):
    """The unoffloaded model's outputs on the GPU: eager, and three CUDA graph replays."""
    ref = copy.deepcopy(base).cuda()
    with torch.no_grad():
        want = ref(ids)
    return want, graph_outputs(ref, ids)


def assert_exact_on_gpu(base, make_plan, while_applied=None):
    """With ``make_plan(spec of base)`` applied, eager and graph replay outputs equal the unoffloaded
    model's bit for bit (``while_applied(base, ids, want)`` checks more); remove() restores every weight."""
    ids = torch.randint(0, 500, (1, 8), device="cuda")
    want, want_graph = reference_outputs(base, ids)
    plan = make_plan(runtime.describe(base))
    before = {name: t.clone() for name, t in base.state_dict().items()}
    with runtime.apply(plan, base, "cuda"):
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(base(ids), want)
        for got, exp in zip(graph_outputs(base, ids), want_graph):
            assert torch.equal(got, exp)
        if while_applied is not None:
            while_applied(base, ids, want)
    for name, t in base.state_dict().items():
        assert t.device.type == "cpu" and torch.equal(t, before[name]), name


@pytest.mark.parametrize("backend,g,k,step", [("prefetch", 3, 2, 2), ("prefetch", 1, 1, 3), ("uva", 2, 1, 1)])
def test_eager_and_graph_bit_identical(backend, g, k, step):
    assert_exact_on_gpu(make_llama(CFG), lambda spec: planner.plan(
        spec, strategy="group", group_size=g, num_in_group=k, prefetch_step=step, backend=backend))
