"""The cpu backend on the CPU: routed experts split between "GPU" (here the CPU too), UVA and the host.

Exactness: host kernels round differently from the GPU's, so the tolerance is measured in the same test: a
split model's logits may differ from the resident model's (transformers' default grouped experts) by no more
than transformers' own two implementations differ (grouped against its per-expert loop) on the same inputs,
and next-token top-1 under teacher forcing (8 prompts x 64 positions) agrees on at least 99% of positions.
On a CPU-only machine every part runs on the CPU, which still exercises the split and the join.
"""

from __future__ import annotations

import importlib
import json

import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import runtime  # noqa: E402
from moe_models import ARCHITECTURES, by_thirds, make_moe, split_plan  # noqa: E402
from runtime import cpu_experts  # noqa: E402
from runtime.cpu_experts import HostExpertsCaptureError, SplitForward  # noqa: E402
from runtime.errors import PlanMismatchError  # noqa: E402
from runtime.host_guard import HostGuard  # noqa: E402
from schemas.measured import MeasuredGraphs, MeasuredHostLevel  # noqa: E402
from schemas.plan_experts import ExpertSplit  # noqa: E402
from test_host_guard import ScriptedMarks  # noqa: E402

PROMPTS, POSITIONS = 8, 64


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls: threads only contend (the host's threads in apply are pinned to 1 below too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_split_experts_match_the_resident_model(arch):
    model = make_moe(arch, implementation="grouped_mm")  # transformers' default
    ids = torch.randint(0, model.config.vocab_size, (PROMPTS, POSITIONS), generator=torch.Generator().manual_seed(1))
    ref = _logits(model, ids)
    step = _logits(model, ids[:, :1])  # a decode step of 8 tokens
    model.set_experts_implementation("eager")
    tolerance = (_logits(model, ids) - ref).abs().max().item()  # two implementations of the same experts
    model.set_experts_implementation("grouped_mm")
    # experts by thirds on the GPU, through UVA and on the host; above 16 tokens the host's go to the "GPU"
    with runtime.apply(split_plan(model, cpu_max_tokens=16), model, device="cpu", host_threads=1):
        out = _logits(model, ids)
        out_step = _logits(model, ids[:, :1])
    assert (out - ref).abs().max().item() <= tolerance
    assert (out_step - step).abs().max().item() <= tolerance
    agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.99, f"top-1 agrees on {agree:.1%} of {PROMPTS * POSITIONS} positions"
    assert torch.equal(_logits(model, ids), ref)  # removed: the model's own forward again


def _snapshot(model):
    return {k: (v.clone(), v.stride(), v.device) for k, v in model.state_dict(keep_vars=True).items()}


def _assert_same(model, snap):
    now = model.state_dict(keep_vars=True)
    assert set(now) == set(snap)
    for k, (v, stride, device) in snap.items():
        assert torch.equal(now[k], v) and now[k].stride() == stride and now[k].device == device, k


@pytest.fixture
def threaded(monkeypatch):
    """The host's part on its own thread, as on a GPU whose streams wait on host flags (on the CPU the issuing
    thread itself waits for the flag)."""
    monkeypatch.setattr(cpu_experts, "flag_waits", lambda device: True)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_hosts_own_thread_computes_what_the_issuing_thread_does(arch, monkeypatch):
    model = make_moe(arch, implementation="grouped_mm")
    ids = torch.randint(0, model.config.vocab_size, (4, 6), generator=torch.Generator().manual_seed(2))
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1):
        inline = [_logits(model, ids), _logits(model, ids[:, :1])]
    monkeypatch.setattr(cpu_experts, "flag_waits", lambda device: True)
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1) as handle:
        assert handle._splits.worker is not None
        with torch.inference_mode():  # the thread computes in the caller's mode
            threaded = [_logits(model, ids), _logits(model, ids[:, :1])]
    assert all(torch.equal(a, b) for a, b in zip(threaded, inline))
    assert not any(t.name == "host-experts" for t in threading.enumerate())  # remove ended the thread


def test_an_error_on_the_hosts_thread_is_raised_by_the_next_call(monkeypatch, threaded):
    model = make_moe("qwen3_moe")
    snap = _snapshot(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 3), generator=torch.Generator().manual_seed(4))
    handle = runtime.apply(split_plan(model), model, device="cpu", host_threads=1)

    def fail(*args, **kwargs):
        raise RuntimeError("injected host failure")

    monkeypatch.setattr(cpu_experts, "host_rows", fail)
    # the first layer's job fails, its flag is raised all the same (a stream would go on); the second layer's
    # call raises it
    with pytest.raises(runtime.ApplyError, match="host's part of a split experts layer failed.*injected"):
        _logits(model, ids)
    monkeypatch.undo()
    handle.remove()
    _assert_same(model, snap)
    assert not any(t.name == "host-experts" for t in threading.enumerate())


def test_remove_restores_bit_identically_and_state_dict_is_truthful():
    model = make_moe("qwen3_moe")
    snap = _snapshot(model)
    experts = model.model.layers[0].mlp.experts
    handle = runtime.apply(split_plan(model), model, device="cpu", host_threads=1)
    assert experts.gate_up_proj.numel() == 0  # the param gave up its storage: its slices hold it
    assert "forward" in experts.__dict__
    live = model.state_dict()
    assert all(torch.equal(live[k], v) for k, (v, _, _) in snap.items())
    handle.remove()
    assert "forward" not in experts.__dict__
    _assert_same(model, snap)


@pytest.mark.parametrize("stored", [{"down_proj"}, {"gate_up_proj", "down_proj"}])
def test_host_memory_experts_stored_transposed_compute_and_restore_the_same(monkeypatch, stored):
    """With the host storing some weights [E, in, out] (``HOST_IN_OUT``: the host's layout before 2026-12-03, kept for
    side-by-side runs; a module of [E, in, out] weights gets the like), the layer's host-memory array is stored so,
    the GPU's pass reads it in that layout beside the GPU-resident experts in the module's, the logits are within the
    backend's tolerance, state_dict is truthful, and remove restores every param bit for bit."""
    from runtime import expert_math

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    snap = _snapshot(model)
    ids = torch.randint(0, model.config.vocab_size, (4, 6), generator=torch.Generator().manual_seed(8))
    ref, step = _logits(model, ids), _logits(model, ids[:, :1])
    model.set_experts_implementation("eager")
    tolerance = (_logits(model, ids) - ref).abs().max().item()
    model.set_experts_implementation("grouped_mm")
    monkeypatch.setattr(expert_math, "HOST_IN_OUT", frozenset(stored))
    with runtime.apply(split_plan(model, cpu_max_tokens=16), model, device="cpu", host_threads=1) as handle:
        placement = handle._splits.forwards[0][2].placement
        first = placement.ids[0]
        for name, array in placement.host.items():  # each weight [E, in, out] where stored so, else the module's
            own = snap[f"model.layers.0.mlp.experts.{name}"][0][first]
            assert torch.equal(array[0], own.T if name in stored else own), name
        assert (_logits(model, ids) - ref).abs().max().item() <= tolerance  # 24 tokens: the GPU's pass reads them all
        assert (_logits(model, ids[:, :1]) - step).abs().max().item() <= tolerance  # 4 tokens: the host computes
        live = model.state_dict()
        assert all(torch.equal(live[k], v) for k, (v, _, _) in snap.items())
        handle.remove()
    _assert_same(model, snap)


def test_only_host_experts_and_a_layer_left_whole():
    model = make_moe("mixtral", implementation="grouped_mm")
    ids = torch.randint(0, 512, (4, 9))
    ref = _logits(model, ids)
    plan = split_plan(model, places=lambda n: {"cpu": list(range(n))}, layers=(1,))
    assert plan.summary.backend == "cpu" and plan.layers[1].experts is None
    with runtime.apply(plan, model, device="cpu", host_threads=1) as handle:
        assert handle.offloader.name == "cpu"
        out = _logits(model, ids)
    assert torch.equal(out, ref)


def test_failed_apply_leaves_the_model_unchanged(monkeypatch):
    model = make_moe("olmoe")
    snap = _snapshot(model)
    calls = []
    real = cpu_experts.ExpertSplits._install

    def fail_second(self, *args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        return real(self, *args)

    monkeypatch.setattr(cpu_experts.ExpertSplits, "_install", fail_second)
    with pytest.raises(RuntimeError, match="injected"):
        runtime.apply(split_plan(model), model, device="cpu", host_threads=1)
    assert len(calls) == 2
    _assert_same(model, snap)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_a_module_that_is_not_an_experts_module_is_refused():
    model = make_moe("qwen3_moe")
    snap = _snapshot(model)
    with pytest.raises(PlanMismatchError, match="its forward reads gate_up_proj, down_proj, which the split leaves out"
                       "|reads down_proj, which the split leaves out"):
        runtime.apply(split_plan(model, only=("gate_up_proj",)), model, device="cpu", host_threads=1)
    _assert_same(model, snap)

    class NotExperts(torch.nn.Module):
        def forward(self, x):
            return x

    model.model.layers[0].mlp.experts.forward = NotExperts().forward
    with pytest.raises(PlanMismatchError, match="not an experts module as transformers 5 writes them"):
        runtime.apply(split_plan(model), model, device="cpu", host_threads=1)
    del model.model.layers[0].mlp.experts.forward


def test_a_guards_summary_is_what_a_stats_file_holds():
    """Handle.stats()["host_levels"] (one HostGuard.summary a split layer) reads back as planner explain reads a
    STATS.json."""
    guard = HostGuard("layers.0", 2, 6, ScriptedMarks())
    for _ in range(3):
        guard.host_turn()
    assert MeasuredHostLevel.model_validate(json.loads(json.dumps(guard.summary()))).model_dump() == guard.summary()


def test_a_cuda_graph_capture_reaching_host_experts_is_refused(monkeypatch):
    model = make_moe("qwen3_moe")
    experts = model.model.layers[0].mlp.experts
    host = cpu_experts._Part({"gate_up_proj": torch.zeros(2, 1, 1)}, torch.zeros(8, dtype=torch.long), None)

    class Placement:  # two host experts, the host's part at every level
        planned = 2

        def at(self, level):
            return host, None

    guard = HostGuard("layers.0", 2, 6, ScriptedMarks())
    split = ExpertSplit(params=["gate_up_proj"], gpu=[0, 1, 2, 3, 4, 5], cpu=[6, 7])
    forward = SplitForward(experts, None, torch.device("cuda"), Placement(), split, guard=guard)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    h = torch.zeros(2, 128)
    with pytest.raises(HostExpertsCaptureError, match="cpu backend"):
        forward(h, torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4))
    assert guard.moved_calls == 0 and not guard.measuring  # the guard is not asked inside a capture


def test_host_threads_are_set_and_given_back(monkeypatch):
    model = make_moe("qwen3_moe")
    torch.set_num_threads(1)
    with runtime.apply(split_plan(model), model, device="cpu"):
        assert torch.get_num_threads() == cpu_experts.host_threads()
    assert torch.get_num_threads() == 1
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1
    torch.set_num_threads(3)
    monkeypatch.setattr(cpu_experts, "flag_waits", lambda device: True)  # the host's own thread computes
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=2) as handle:
        assert torch.get_num_threads() == 1 and handle._splits.worker.threads == 2  # one CPU left for issuing
    assert torch.get_num_threads() == 3
    torch.set_num_threads(1)
    for bad in (0, 1.5, True):
        with pytest.raises(runtime.ApplyError, match="host_threads="):
            runtime.apply(split_plan(model), model, device="cpu", host_threads=bad)


def test_by_thirds_places_every_expert_once():
    places = by_thirds(16)
    assert sorted(e for ids in places.values() for e in ids) == list(range(16))


def test_torch_compile_runs_host_experts_eagerly_between_graphs():
    model = make_moe("qwen3_moe", implementation="grouped_mm")
    block = model.model.layers[0].mlp  # router, then the experts: a graph, a break, the host's part run eagerly
    x = torch.randn(1, 5, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with torch.no_grad(), runtime.apply(split_plan(model), model, device="cpu", host_threads=1):
        eager = block(x)
        out = torch.compile(block, backend="eager")(x)
    assert torch.equal(out, eager)


def test_routing_is_recorded_alone_and_while_applied(tmp_path):
    from runtime.routing import record_routing
    from schemas.io import dump_model, load_routing

    model = make_moe("olmoe", implementation="grouped_mm")
    ids = torch.randint(0, 512, (3, 12))  # 36 tokens: the host's grouped kernel, exact
    with record_routing(model) as recorder, torch.no_grad():
        routing = model(ids).logits
        stats = recorder.stats("olmoe", "test")
    assert [layer.layer for layer in stats.layers] == ["model.layers.0", "model.layers.1"]
    assert all(layer.tokens == 36 and sum(layer.counts) == 36 * 4 for layer in stats.layers)
    with runtime.apply(split_plan(model), model, device="cpu", record_routing=True, host_threads=1) as handle:
        with torch.no_grad():
            assert torch.equal(model(ids).logits, routing)
        assert handle.routing_stats().layers == stats.layers  # the same choices, counted by the plan's layers
    path = tmp_path / "routing.yaml"
    path.write_text(dump_model(stats))
    assert load_routing(path)[0] == stats
    with pytest.raises(runtime.ApplyError, match="record_routing=True"):
        with runtime.apply(split_plan(model), model, device="cpu", host_threads=1) as handle:
            handle.routing_stats()


def test_the_host_buffers_are_made_on_the_issuing_thread_once_and_reused(threaded, monkeypatch):
    """Nothing is allocated per call and nothing ever on the host's thread: a pinned buffer that the host's thread
    freed would record an event on the copy's stream, which waits while the stream's queue is full, the stream
    waiting for that thread (runtime/stream_wait.py; a stalled generate() on the H200, 2026-12-02)."""
    made = []
    real = cpu_experts._Staging.take

    def take(self, name, shape, dtype):
        before = self.buffers.get(name)
        out = real(self, name, shape, dtype)
        if self.buffers[name] is not before:
            made.append((name, threading.current_thread().name))
        return out

    monkeypatch.setattr(cpu_experts._Staging, "take", take)
    model = make_moe("qwen3_moe")
    ids = torch.randint(0, model.config.vocab_size, (4, 6), generator=torch.Generator().manual_seed(5))
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1) as handle:
        assert handle._splits.worker is not None
        stagings = list(handle._splits.stagings)
        first = _logits(model, ids)
        at_first = len(made)
        assert at_first and {thread for _, thread in made} == {threading.main_thread().name}
        assert torch.equal(_logits(model, ids), first)  # the buffers reused, the result the same
        _logits(model, ids[:, :2])
        assert len(made) == at_first
        _logits(model, torch.cat([ids, ids]))  # more tokens: each buffer grows once, the old one kept
        assert len(made) > at_first and any(s.outgrown for s in stagings)
        assert {thread for _, thread in made} == {threading.main_thread().name}
    assert all(not s.buffers and not s.outgrown for s in stagings)  # remove let them go


def test_a_count_the_stream_writes_is_reached_across_the_wrap():
    from runtime.stream_wait import reached

    assert reached(1, 1) and reached(2, 1) and not reached(0, 1)
    assert reached(0, 0xFFFFFFFF) and reached(3, 0xFFFFFFFE)  # the count wrapped past 2**32 - 1
    assert not reached(0xFFFFFFFF, 2)  # far behind (the driver's signed difference), not far ahead


def test_a_split_layer_holds_no_more_than_the_grouped_module_however_many_parts_run(monkeypatch):
    """A call over ``cpu_max_tokens`` runs two parts on the compute device (the host-memory experts read in place, and
    the GPU's own): their rows are added in place and each part's own let go before the next runs, so the layer's
    tensors alive at once stay those of transformers' grouped module (the plan's activations model that one:
    planner/memory/activations.py), not one [T·k, H] more a part. Counted on the CPU, tensor by tensor."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from bench_memory import LiveBytes

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    experts = model.model.layers[0].mlp.experts
    tokens, g = 1024, torch.Generator().manual_seed(4)
    n, k, h = experts.num_experts, model.config.num_experts_per_tok, model.config.hidden_size
    index = torch.rand(tokens, n, generator=g).argsort(dim=1)[:, :k]
    weights = torch.softmax(torch.randn(tokens, k, generator=g), -1).to(torch.bfloat16)
    x = torch.randn(tokens, h, generator=g).to(torch.bfloat16)

    def peak() -> tuple[int, torch.Tensor]:
        mode = LiveBytes()
        with torch.inference_mode(), mode:
            out = experts(x, index, weights)
        return mode.peak, out

    grouped, want = peak()
    # every part through the grouped kernel, as on a GPU (on the CPU as the device, parts of many rows an expert take
    # a matmul per expert instead, whose temporaries are the host's memory, not the GPU budget the plan holds to)
    from runtime import expert_math

    monkeypatch.setattr(expert_math, "HOST_LOOP_ROWS", 1 << 30)
    plan = split_plan(model, by_thirds, cpu_max_tokens=1, layers=(0,))
    with runtime.apply(plan, model, device="cpu"):
        split, got = peak()
    assert torch.allclose(got.float(), want.float(), atol=1e-2, rtol=0)
    rows = tokens * k * h * 2  # one [T·k, H] in bf16
    assert split <= grouped + rows // 8, (split / rows, grouped / rows)


def test_a_second_threads_forward_is_refused_while_host_experts_run(monkeypatch):
    model = make_moe("qwen3_moe")
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(6))
    inside, go_on, seen = threading.Event(), threading.Event(), {}

    def hold(_module, _args):
        if threading.current_thread().name == "first":
            inside.set()
            go_on.wait(10)

    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1):
        want = _logits(model, ids)
        hook = model.model.layers[1].register_forward_pre_hook(hold)
        t = threading.Thread(target=lambda: seen.setdefault("first", torch.equal(_logits(model, ids), want)),
                             name="first")
        t.start()
        assert inside.wait(10)
        with pytest.raises(runtime.ConcurrentForwardError):
            _logits(model, ids)
        go_on.set()
        t.join(10)
        hook.remove()
        assert seen == {"first": True}


@pytest.mark.parametrize("held", ["forward", "layer"])
def test_a_split_layer_used_by_two_threads_is_refused_either_way(held):
    """A layer whose host experts use the layer's host buffers is used by one thread at a time: a second thread's
    call of the layer while a forward is inside it is refused (the gate), and so is a forward while another
    thread's call of the layer is inside its experts (the layer's own lock); the one that runs is exact."""
    model = make_moe("qwen3_moe")
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(6))
    x = torch.randn(2, 6, model.config.hidden_size, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    inside, go_on, seen = threading.Event(), threading.Event(), {}

    def hold(*_):
        if threading.current_thread().name == "first" and not inside.is_set():
            inside.set()
            go_on.wait(10)

    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1), torch.no_grad():
        want, want_layer = model(ids).logits, model.model.layers[0].mlp(x)
        forward = lambda: torch.equal(model(ids).logits, want)  # noqa: E731
        layer = lambda: torch.equal(model.model.layers[0].mlp(x), want_layer)  # noqa: E731
        first, second = (forward, layer) if held == "forward" else (layer, forward)
        hook = model.model.layers[0].mlp.experts.act_fn.register_forward_hook(hold)  # inside the experts' call

        def run():
            with torch.no_grad():
                seen["first"] = first()

        t = threading.Thread(target=run, name="first")
        t.start()
        assert inside.wait(10)
        with pytest.raises(runtime.ConcurrentForwardError, match="another thread"):
            second()
        go_on.set()
        t.join(10)
        hook.remove()
        assert seen == {"first": True}
        assert forward() and layer()


def test_a_forward_from_a_hook_inside_a_split_layer_is_refused_and_the_model_stays_exact():
    """A forward of the model from a hook inside a split layer's experts would rewrite the layer's host buffers
    before the outer call hands them to the host: refused, and the next forward is exact."""
    model = make_moe("qwen3_moe")
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(6))
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1), torch.no_grad():
        want = model(ids).logits
        hook = model.model.layers[0].mlp.experts.act_fn.register_forward_hook(lambda *_: model(ids))
        with pytest.raises(runtime.ApplyError, match="called again while its own call"):
            model(ids)
        hook.remove()
        assert torch.equal(model(ids).logits, want)


# -- the host guard (runtime/host_guard.py) in the backend: on the CPU the host's own thread runs as on a GPU whose
# streams wait on host flags, and the guard's marks are scripted (tests/test_host_guard.py)

@pytest.mark.parametrize("wait_ms", [0.0, 5.0, 50.0])
def test_a_split_layer_hands_host_experts_to_uva_while_the_host_is_late(monkeypatch, threaded, wait_ms):
    """The stream waits ``wait_ms`` for the host's rows after 10 ms of GPU parts: on time the host takes experts
    from the link; 5 ms late it hands some to the link (a level between the two); 50 ms late (longer than the GPU's
    read of every host-memory expert) it hands them all to the link for a while. Every level's logits are within
    the backend's tolerance."""
    late = wait_ms > 0
    model = make_moe("qwen3_moe", implementation="grouped_mm")
    ids = torch.randint(0, model.config.vocab_size, (4, 1), generator=torch.Generator().manual_seed(3))
    ref = _logits(model, ids)
    model.set_experts_implementation("eager")
    tolerance = (_logits(model, ids) - ref).abs().max().item()
    model.set_experts_implementation("grouped_mm")
    monkeypatch.setattr(cpu_experts, "new_marks", lambda device: ScriptedMarks(10.0, wait_ms))
    levels = []  # (the level asked for, the host's experts in the part it gets)
    real = cpu_experts._Placement.at

    def at(self, level):
        parts = real(self, level)
        levels.append((level, self.planned, self.most, parts))
        return parts

    monkeypatch.setattr(cpu_experts._Placement, "at", at)
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1) as handle:
        levels.clear()  # the levels apply makes beforehand (0 and the plan's)
        splits = handle._splits
        layers = len(splits.guards)
        assert layers == len(model.model.layers)  # every split layer with UVA experts has a guard
        outs = [_logits(model, ids) for _ in range(12)]
        summary = splits.host_levels()
        assert handle.stats()["host_levels"] == summary
    assert all((out - ref).abs().max().item() <= tolerance for out in outs)  # every level: within the tolerance
    assert len(levels) == 12 * layers
    for level, planned, most, (host, gpu) in levels:  # the host computes ``level`` experts, the GPU's pass the rest
        n_host = 0 if host is None else next(iter(host.weights.values())).shape[0]
        n_uva = next(iter(gpu.weights[0].values())).shape[0] if level < most else 0
        assert (n_host, n_uva) == (level, most - level)
    if wait_ms > 10.0:  # later than the GPU's read of them all: every one through UVA, held
        assert any(level == 0 for level, _, _, _ in levels)
        assert all(s["all_uva_calls"] > 0 for s in summary.values()), summary
    elif late:  # the host 5 ms late (not as late as the GPU's read of them all): experts handed to the link
        assert any(0 < level < planned for level, planned, _, _ in levels)  # cut between the host and the link
        assert all(s["moved_calls"] > 0 and s["now"] < s["planned"] for s in summary.values())
        assert all(s["all_uva_calls"] == 0 for s in summary.values())
    else:  # the host's part well under the scripted 10 ms of the GPU's: experts taken from the link
        assert all(level >= planned for level, planned, _, _ in levels)
        assert any(level > planned for level, planned, _, _ in levels)
        assert all(s["moved_calls"] == 0 and s["more_calls"] > 0 and s["now"] > s["planned"] for s in summary.values())


def test_no_guard_off_a_gpu_worker_or_without_uva_experts(threaded, monkeypatch):
    model = make_moe("qwen3_moe", implementation="grouped_mm")
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1) as handle:
        assert handle._splits.guards == []  # new_marks: none off a GPU
    monkeypatch.setattr(cpu_experts, "new_marks", lambda device: ScriptedMarks())
    plan = split_plan(model, places=lambda n: {"gpu": list(range(n // 2)), "cpu": list(range(n // 2, n))})
    with runtime.apply(plan, model, device="cpu", host_threads=1) as handle:
        assert handle._splits.guards == []  # no UVA experts: nothing to time the link by
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1, host_levels=False) as handle:
        assert handle._splits.guards == []
    for bad in (0, "yes", None):
        with pytest.raises(runtime.ApplyError, match="host_levels="):
            runtime.apply(split_plan(model), model, device="cpu", host_levels=bad)


def test_every_level_cuts_the_host_memory_experts_between_the_host_and_the_gpus_pass():
    """The host-memory array (the plan's uva experts, then its cpu experts) at each level: the host's part holds the
    last ``level`` experts, the GPU's pass the others and then the GPU-resident ones, each expert once with its own
    weights, the host-memory parts views of the one array."""
    uva, cpu, on_gpu, experts = [5, 2], [6, 4, 0], [1, 3], 7
    ids = uva + cpu
    array = torch.arange(len(ids) * 3, dtype=torch.float32).view(len(ids), 3, 1)
    resident = -torch.arange(1, len(on_gpu) * 3 + 1, dtype=torch.float32).view(len(on_gpu), 3, 1)
    place = cpu_experts.expert_places(ids, on_gpu, experts)
    placement = cpu_experts._Placement(ids, len(cpu), None, None, {"w": array}, {"w": array}, {"w": resident}, place,
                                       place)
    weight_of = {e: array[i] for i, e in enumerate(ids)} | {e: resident[i] for i, e in enumerate(on_gpu)}
    for level in range(len(ids) + 1):
        host, gpu = placement.at(level)
        host_own, link_own = ids[len(ids) - level:], ids[:len(ids) - level] + on_gpu
        if level:
            table, w = host.table.tolist(), host.weights["w"]
            assert w.shape[0] == level and w.data_ptr() == weight_of[host_own[0]].data_ptr()  # a view: no copy
            for e in range(experts):
                assert torch.equal(w[table[e]], weight_of[e]) if e in host_own else table[e] == level
        else:
            assert host is None
        stacked = torch.cat([part["w"] for part in gpu.weights])
        table = gpu.table.tolist()
        for e in range(experts):  # the GPU's pass: its experts in the parts' order, the host's past the end
            assert torch.equal(stacked[table[e]], weight_of[e]) if e in link_own else table[e] == len(link_own)
        assert placement.at(level) is placement.at(level)

def test_eager_decode_calls_of_gpu_experts_go_through_shape_graphs(monkeypatch):
    """The wiring of runtime/shape_graphs.py into split layers, on the CPU with a stand-in graph (its replay re-runs
    the function on the static inputs): a layer whose experts the GPU's kernels compute (gpu and uva, level 0)
    routes its calls through its ShapeGraphs, which captures each decode shape at its second call; the logits are
    those of the same plan applied with ``expert_graphs=False`` bit for bit at every call, ``stats()`` counts the
    graphs, and remove() lets them go. On a CPU device no graphs are made at all; a bad value is refused."""
    from runtime import shape_graphs
    from test_shape_graphs import _stand_in

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    places = lambda n: {"gpu": list(range(0, n, 3)), "uva": [e for e in range(n) if e % 3]}  # noqa: E731
    steps = [torch.randint(0, model.config.vocab_size, (b, 1), generator=torch.Generator().manual_seed(i))
             for i, b in enumerate((2, 2, 1, 2, 1, 1))]  # two decode shapes, each called more than twice
    with runtime.apply(split_plan(model, places), model, device="cpu") as handle:
        assert all(f.graphs is None for _, _, f in handle._splits.forwards)
        assert "expert_graphs" not in handle.stats()
        want = [_logits(model, x) for x in steps]
    monkeypatch.setattr(importlib.import_module("runtime.apply"), "graphs_here", lambda device: True)
    monkeypatch.setattr(shape_graphs, "graphs_here", lambda device: True)
    monkeypatch.setattr(shape_graphs.ShapeGraphs, "_captured", _stand_in)
    monkeypatch.setattr(shape_graphs.GraphPool, "order", lambda self: None)  # the stream's wait: CUDA's
    with runtime.apply(split_plan(model, places), model, device="cpu", expert_graphs=False) as handle:
        assert all(f.graphs is None for _, _, f in handle._splits.forwards)
    with runtime.apply(split_plan(model, places), model, device="cpu") as handle:  # (no memory section: on)
        forwards = [f for _, _, f in handle._splits.forwards]
        assert forwards and all(f.graphs is not None for f in forwards)
        got = [_logits(model, x) for x in steps]
        stats = handle.stats()["expert_graphs"]
        assert {k: stats[k] for k in ("layers", "graphs", "failed")} == {
            "layers": len(forwards), "graphs": 2 * len(forwards), "failed": 0}
        held = {id(t): t.nbytes for f in forwards for e in f.graphs.graphs.values() for t in (*e.inputs, e.output)}
        assert stats["bytes"] == sum(held.values()) > 0  # one set of static tensors a shape, whatever the layers
        assert len(held) == 2 * 4  # two shapes: hidden states, ids and weights in, the output
        written = json.loads(json.dumps(handle.stats()))  # a STATS.json for planner explain --measured
        assert MeasuredGraphs.model_validate(written["expert_graphs"]).model_dump() == stats
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert all(not f.graphs.graphs for f in forwards)  # let go at remove()
    for bad in (1, "yes", "auto"):
        with pytest.raises(runtime.ApplyError, match="expert_graphs="):
            runtime.apply(split_plan(model, places), model, device="cpu", expert_graphs=bad)


def test_a_layer_whose_experts_module_offloads_more_than_its_split_is_not_graphed():
    from schemas.expert_graphs import offloaded_beside as _offloaded_beside

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    plan = split_plan(model, lambda n: {"gpu": [0], "uva": list(range(1, n))})
    layer = next(layer for layer in plan.layers if layer.experts is not None)
    assert not _offloaded_beside(layer)
    parent = layer.experts.params[0].rpartition(".")[0]
    beside = layer.model_copy(update={"offloaded": [*layer.offloaded, f"{parent}.norm.weight"]})
    assert _offloaded_beside(beside)
    elsewhere = layer.model_copy(update={"offloaded": [*layer.offloaded, "self_attn.q_proj.weight"]})
    assert not _offloaded_beside(elsewhere)


def test_the_runtime_graphs_the_calls_the_planner_prices_as_graphed(monkeypatch):
    """One rule for both (schemas.expert_graphs.graphed): on a plan with host experts and ``cpu_max_tokens`` 16, the
    calls a split layer replays from a graph (stand-in capture on the CPU) are those the planner prices as graphed:
    none while the host computes (at most 16 tokens), those above it up to GRAPHED_MAX_TOKENS, none beyond."""
    from runtime import shape_graphs
    from schemas.expert_graphs import GRAPHED_MAX_TOKENS, graphed
    from test_shape_graphs import _stand_in

    monkeypatch.setattr(importlib.import_module("runtime.apply"), "graphs_here", lambda device: True)
    monkeypatch.setattr(shape_graphs, "graphs_here", lambda device: True)
    monkeypatch.setattr(shape_graphs.ShapeGraphs, "_captured", _stand_in)
    monkeypatch.setattr(shape_graphs.GraphPool, "order", lambda self: None)
    model = make_moe("qwen3_moe", implementation="grouped_mm")
    plan = split_plan(model, cpu_max_tokens=16)
    layers = {layer.name: layer for layer in plan.layers if layer.experts is not None}
    sizes = (1, 16, 17, GRAPHED_MAX_TOKENS, GRAPHED_MAX_TOKENS + 1)
    with runtime.apply(plan, model, device="cpu", host_threads=1, expert_graphs=True) as handle:
        for tokens in sizes:
            ids = torch.randint(0, model.config.vocab_size, (tokens, 1), generator=torch.Generator().manual_seed(tokens))
            _logits(model, ids), _logits(model, ids)
        forwards = [f for _, _, f in handle._splits.forwards]
        replayed = {tokens: [any(key[0][0][0] == tokens for key in f.graphs.graphs) for f in forwards]
                    for tokens in sizes}
    priced = {tokens: [graphed(layer, tokens) for layer in layers.values()] for tokens in sizes}
    assert len(forwards) == len(layers) > 0
    assert replayed == priced
    assert priced[17] == [True] * len(layers) and priced[1] == [False] * len(layers)
