from conftest import make_spec

from planner.layers import build_graph, find_block_stack, layers_in_order, tied_edges, tied_owners
from schemas import SpecFile


def _graph(names, tied=None):
    layers = [{"name": n, "params": {"w": [2, 2]}} for n in names]
    for idx, ties in (tied or {}).items():
        layers[idx]["tied"] = ties
    spec = SpecFile.model_validate({"model": {"name": "t", "dtype": "float32", "layers": layers}})
    return build_graph(spec.model.expanded())


def test_layers_in_execution_order(llama8b):
    g = build_graph(llama8b.model.expanded())
    names = g.names
    assert names[0] == "model.embed_tokens" and names[-1] == "lm_head" and len(names) == 35
    assert [layer.name for layer in llama8b.model.expanded()] == names
    assert g.layers[names.index("model.layers.0")].nbytes == 436224000
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


def test_tied_params_join_a_layer_to_its_owner():
    g = _graph(["emb", "blk.0", "blk.1", "head"], tied={3: {"t": "emb.w", "s": "blk.1.w"}, 1: {"u": "blk.1.w"}})
    assert tied_edges(g) == [("blk.0", "blk.1", [("u", "blk.1.w")]),  # in execution order of the tied layer
                             ("head", "emb", [("t", "emb.w")]), ("head", "blk.1", [("s", "blk.1.w")])]
    assert tied_owners(g) == {"emb": {"w"}, "blk.1": {"w"}}
    assert g.layers[3].nbytes == 16  # its own w only; the tied t and s are counted at their owners


def test_graph_build_scales_linearly():
    spec = make_spec([{f"p{k}": [4, 4] for k in range(20)} for _ in range(300)])
    g = build_graph(spec.model.expanded())
    assert len(g.layers) == 302 and g.ties == {}
    assert len(find_block_stack(g)) == 300
