from conftest import make_spec

from planner.layers import build_graph, find_block_stack, layers_in_order, tied_edges, tied_owners
from schemas import SpecFile


def _graph(names, tied=None):
    layers = [{"name": n, "params": {"w": [2, 2]}} for n in names]
    for idx, ties in (tied or {}).items():
        layers[idx]["tied"] = ties
    spec = SpecFile.model_validate({"model": {"name": "t", "dtype": "float32", "layers": layers}})
    return build_graph(spec.model.expanded())


def test_nodes_in_execution_order_with_next_edges(llama8b):
    g = build_graph(llama8b.model.expanded())
    names = list(g.nodes)
    assert names[0] == "model.embed_tokens" and names[-1] == "lm_head" and len(names) == 35
    assert [(u, v) for u, v, d in g.edges(data=True) if d["kind"] == "next"] == list(zip(names, names[1:]))
    assert g.nodes["model.layers.0"]["bytes"] == 436224000
    assert [layer.name for layer in layers_in_order(g)] == names


def test_block_stack_is_longest_consecutive_run(llama8b):
    g = build_graph(llama8b.model.expanded())
    assert find_block_stack(g) == [f"model.layers.{i}" for i in range(32)]
    assert find_block_stack(_graph(["a", "b"])) == []
    # a gap in the ints or a change of prefix ends a run; the longest run wins, the first on a tie
    g = _graph(["x.0", "x.1", "y.2", "y.3", "y.4", "z.0", "z.2", "h.7"])
    assert find_block_stack(g) == ["y.2", "y.3", "y.4"]
    assert find_block_stack(_graph(["a.0", "a.1", "b", "c.5", "c.6"])) == ["a.0", "a.1"]
    assert find_block_stack(_graph(["a.3"])) == ["a.3"]


def test_tied_params_are_edges_to_the_owner():
    g = _graph(["emb", "blk.0", "blk.1", "head"], tied={3: {"t": "emb.w"}, 1: {"u": "blk.1.w"}})
    assert g.edges["head", "emb"]["kind"] == "tied"
    assert g.edges["head", "emb"]["tied"] == [("t", "emb.w")]
    # owner right after the tied layer: the next edge carries the tie
    assert g.edges["blk.0", "blk.1"]["kind"] == "next" and g.edges["blk.0", "blk.1"]["tied"] == [("u", "blk.1.w")]
    assert sorted((u, v) for u, v, _ in tied_edges(g)) == [("blk.0", "blk.1"), ("head", "emb")]
    assert tied_owners(g) == {"emb": {"w"}, "blk.1": {"w"}}
    assert g.nodes["head"]["bytes"] == 16  # its own w only; the tied t is counted at emb


def test_graph_build_scales_linearly():
    spec = make_spec([{f"p{k}": [4, 4] for k in range(20)} for _ in range(300)])
    g = build_graph(spec.model.expanded())
    assert g.number_of_nodes() == 302 and g.number_of_edges() == 301
    assert len(find_block_stack(g)) == 300
