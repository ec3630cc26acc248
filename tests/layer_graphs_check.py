"""The GPU check of an applied plan's layer graphs (runtime/shape_graphs.py), shared by the split layers' test
(tests/test_cpu_experts_gpu.py) and the experts modules' (tests/test_experts_forward_gpu.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

import runtime
from schemas.expert_graphs import static_bytes


def replayed(model, x):
    """``model``'s logits for ``x`` from a CUDA graph replay (captured after a warm-up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(x, use_cache=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(x, use_cache=False).logits
    graph.replay()
    return out.clone()


def check_layer_graphs(model, plan, forwards_of: Callable[[object], list]) -> None:
    """On a GPU: eager decode steps (4 and 1 tokens, each shape more than twice, inference_mode and no_grad in turn)
    under ``plan`` give the logits of the same plan applied with ``expert_graphs=False``, and of the resident model,
    bit for bit; each wrapped forward (``forwards_of(handle)``: objects with ``graphs``) holds one graph a shape and
    none failed; a forward with autograd on captures nothing; a whole-model capture while applied gives the logits the
    same capture gives without the layer graphs; greedy ``generate()`` with the dynamic and the static cache picks the
    resident model's tokens; remove() lets the graphs go."""
    vocab = model.config.vocab_size
    steps = [torch.randint(0, vocab, (b, 1), generator=torch.Generator().manual_seed(i)).cuda()
             for i, b in enumerate((4, 4, 1, 4, 1, 1, 4))]
    prompt = torch.randint(0, vocab, (2, 6), generator=torch.Generator().manual_seed(9)).cuda()

    def run():
        out = []
        for i, x in enumerate(steps):
            with torch.no_grad() if i % 2 else torch.inference_mode():
                out.append(model(x, use_cache=False).logits.clone())
        return out

    def generated():
        with torch.inference_mode():
            return [model.generate(prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8,
                                   cache_implementation=cache) for cache in (None, "static")]

    want, tokens = run(), generated()
    with runtime.apply(plan, model, device="cuda", expert_graphs=False):
        plain = run()
        with torch.inference_mode():
            plain_replayed = replayed(model, steps[0])
    with runtime.apply(plan, model, device="cuda", expert_graphs=True) as handle:  # (a toy's plan may count none)
        got = run()
        stats = handle.stats()["expert_graphs"]
        model(steps[2], use_cache=False)  # autograd on: nothing captured, nothing replayed
        model(steps[0][:3], use_cache=False)
        model(steps[0][:3], use_cache=False)
        assert handle.stats()["expert_graphs"] == stats
        with torch.inference_mode():
            graph_replayed = replayed(model, steps[0])
        generated_here = generated()
        forwards = forwards_of(handle)
    layers = len(forwards)
    assert layers and {k: stats[k] for k in ("layers", "graphs", "failed")} == {
        "layers": layers, "graphs": 2 * layers, "failed": 0}, stats
    config = model.config  # one set of static tensors a shape (4 and 1 tokens), whatever the layers
    counted = sum(static_bytes(t, config.hidden_size, config.num_experts_per_tok, 2) for t in (4, 1))
    assert 2 * config.hidden_size * 2 * (4 + 1) < stats["bytes"] <= counted, (stats, counted)
    assert stats["pool_bytes"] > 0, stats  # the graphs' pool: segments of the allocator's own
    for g, p, w in zip(got, plain, want):
        assert torch.equal(g, p) and torch.equal(g, w)
    assert torch.equal(graph_replayed, plain_replayed)
    assert all(torch.equal(a, b) for a, b in zip(generated_here, tokens))
    assert all(not f.graphs.graphs for f in forwards)
