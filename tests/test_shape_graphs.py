"""runtime/shape_graphs.py's decisions on the CPU: which calls run eagerly, when a shape is captured, what a replay
returns, what a failed capture leaves. The capture itself is CUDA's: here a stand-in graph re-runs the function on
the static inputs into the captured output, as a replay would (tests/test_cpu_experts_gpu.py runs the real one)."""

from __future__ import annotations

import logging
import threading

import pytest

torch = pytest.importorskip("torch")

from runtime import shape_graphs  # noqa: E402
from runtime.shape_graphs import GraphPool, ShapeGraphs, _Graph  # noqa: E402


class _Replay:
    def __init__(self, fn, static, output):
        self.fn, self.static, self.output = fn, static, output

    def replay(self):
        self.output.copy_(self.fn(*self.static))


def _stand_in(self, static):
    """The capture as CUDA's would leave it: the pool's static inputs, the pool's output of the result's shape, and
    a replay that runs the function on the one into the other."""
    output = self.pool.static_output(self.fn(*static))
    replay = _Replay(self.fn, static, output)
    replay.replay()
    return _Graph(replay, static, output)


ORDERED: list = []


@pytest.fixture
def graphs(monkeypatch):
    """A ShapeGraphs of (x, y) -> 2x + y whose calls are all allowed to replay, the calls of the function recorded."""
    monkeypatch.setattr(ShapeGraphs, "applies", lambda self, first: self.failed is None
                        and first.shape[0] <= self.max_tokens)
    monkeypatch.setattr(ShapeGraphs, "_captured", _stand_in)
    monkeypatch.setattr(GraphPool, "order", lambda self: ORDERED.append(self))  # the stream's wait: CUDA's
    ORDERED.clear()
    calls = []

    def fn(x, y):
        calls.append((x, y))
        return 2 * x + y

    g = GraphPool(torch.device("cpu"), max_shapes=2).wrap(fn, "layer 0's experts")
    g.max_tokens = 4
    return g, calls


def _xy(tokens: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, 3, generator=gen), torch.randn(tokens, 3, generator=gen)


def test_the_first_call_of_a_shape_runs_eagerly_and_the_second_is_captured(graphs):
    g, calls = graphs
    x, y = _xy(2, 0)
    assert torch.equal(g(x, y), 2 * x + y)
    assert not g.graphs and calls[-1][0] is x  # eager: the caller's own tensors
    x2, y2 = _xy(2, 1)
    out = g(x2, y2)
    assert len(g.graphs) == 1 and torch.equal(out, 2 * x2 + y2)
    entry = next(iter(g.graphs.values()))
    assert out is not entry.output and out.data_ptr() != entry.output.data_ptr()  # a copy: the next replay rewrites
    n = len(calls)
    x3, y3 = _xy(2, 2)
    kept = out.clone()
    assert torch.equal(g(x3, y3), 2 * x3 + y3)  # the new inputs copied in, replayed
    assert len(calls) == n + 1 and calls[-1][0] is entry.inputs[0]  # the replay read the static inputs
    assert torch.equal(out, kept)  # what the caller was given earlier is its own


def test_shapes_and_dtypes_each_get_their_graph_up_to_the_limit(graphs):
    g, _ = graphs
    for tokens in (1, 2, 3):
        for seed in (0, 1):
            x, y = _xy(tokens, seed)
            assert torch.equal(g(x, y), 2 * x + y)
    assert len(g.graphs) == 2  # the pool's max_shapes: the third shape stays eager
    x, y = _xy(1, 5)
    for _ in range(2):
        assert torch.equal(g(x.double(), y.double()), 2 * x.double() + y.double())
    assert len(g.graphs) == 2 and all(key[0][1] == torch.float32 for key in g.graphs)


def test_the_graphs_of_a_pool_share_one_set_of_static_tensors_a_shape_and_the_pool_caps_the_shapes(graphs):
    """Two functions of one pool (two layers' experts): one graph each a shape, the same static inputs and output
    for both, so the bytes held do not grow with the functions; a shape beyond the pool's two runs as launched in
    either, and a replay of one leaves what the other returned alone."""
    g, calls = graphs
    h = g.pool.wrap(lambda x, y: x - y, "layer 1's experts")
    h.max_tokens = 4
    for tokens in (1, 2):
        for seed in (0, 1):
            x, y = _xy(tokens, seed)
            assert torch.equal(g(x, y), 2 * x + y) and torch.equal(h(x, y), x - y)
    assert len(g.graphs) == len(h.graphs) == 2 and len(g.pool.statics) == len(g.pool.outputs) == 2
    for key, entry in g.graphs.items():
        assert entry.inputs is h.graphs[key].inputs and entry.output is h.graphs[key].output
    held = sum(t.nbytes for key in g.graphs for t in (*g.pool.statics[key], g.pool.outputs[key[:1]]))
    assert g.pool.counts() == {"layers": 2, "graphs": 4, "failed": 0, "bytes": held, "pool_bytes": 0}
    x, y = _xy(2, 7)
    a = g(x, y)
    b = h(x, y)
    assert torch.equal(a, 2 * x + y) and torch.equal(b, x - y)  # each its own copy of the shared output
    x3, y3 = _xy(3, 0)
    for _ in range(3):
        assert torch.equal(g(x3, y3), 2 * x3 + y3) and torch.equal(h(x3, y3), x3 - y3)
    assert len(g.pool.statics) == 2 and calls[-1][0] is x3  # a third shape: launched, on the caller's tensors
    g.pool.close()
    assert not g.pool.statics and not g.pool.outputs and g.pool.counts()["bytes"] == 0


def test_calls_above_max_tokens_run_eagerly(graphs):
    g, calls = graphs
    x, y = _xy(5, 0)
    for _ in range(3):
        assert torch.equal(g(x, y), 2 * x + y)
    assert not g.graphs and all(c[0] is x for c in calls)


def test_a_failed_capture_leaves_the_function_eager_and_says_so(graphs, monkeypatch, caplog):
    g, calls = graphs

    def refuses(self, inputs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(ShapeGraphs, "_captured", refuses)
    x, y = _xy(2, 0)
    with caplog.at_level(logging.WARNING, logger=shape_graphs.__name__):
        outs = [g(x, y) for _ in range(4)]
    assert all(torch.equal(o, 2 * x + y) for o in outs)
    assert not g.graphs and g.failed is not None and "not permitted" in g.failed
    assert "layer 0's experts" in caplog.text and "eagerly" in caplog.text
    assert len(calls) == 4


def test_close_lets_go_of_the_graphs(graphs):
    g, _ = graphs
    x, y = _xy(1, 0)
    g(x, y), g(x, y)
    assert g.graphs
    g.close()
    assert not g.graphs and not g.seen


def test_the_real_conditions_refuse_the_cpu_and_autograd():
    g = ShapeGraphs(lambda x: x, "f", GraphPool(torch.device("cpu")))
    x = torch.ones(1, 2)
    with torch.no_grad():
        assert not g.applies(x)  # not a CUDA tensor
    assert g(x) is x and not g.graphs and not g.seen


def test_replays_take_the_pools_turn_and_a_second_thread_runs_its_call_as_launched(graphs):
    """Every capture and replay orders the caller's stream after the pool's last replay (``GraphPool.order``); while
    another thread holds the pool's turn a call runs the function on its own inputs, captures nothing and leaves
    the graphs' static inputs alone."""
    g, calls = graphs
    x, y = _xy(2, 0)
    g(x, y), g(x, y), g(x, y)
    assert len(ORDERED) == 2 and all(p is g.pool for p in ORDERED)  # the capture's call and the replay
    entry = next(iter(g.graphs.values()))
    static = entry.inputs[0].clone()
    held, release = threading.Event(), threading.Event()

    def holder():
        with g.pool.turn:
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    try:
        x2, y2 = _xy(2, 1)
        x3, y3 = _xy(3, 1)
        assert torch.equal(g(x2, y2), 2 * x2 + y2) and calls[-1][0] is x2  # launched, on the caller's tensors
        g(x3, y3), g(x3, y3)  # a new shape's second call: not captured while the turn is taken
        assert len(g.graphs) == 1 and torch.equal(entry.inputs[0], static) and len(ORDERED) == 2
    finally:
        release.set()
        t.join()
    g(x3, y3)
    assert len(g.graphs) == 2
