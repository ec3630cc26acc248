"""The cpu backend on a GPU while the issuing thread fills the stream's queue (issue 21; a stalled generate()
on the H200, docs/BENCHMARKS.md 2026-12-02 04:20). The host's thread must finish every layer whatever the issuing
thread does: it makes no CUDA call (runtime/stream_wait.py). Here the host's part is made slow (50 ms a layer) and
the issuing thread launches 4,000 small kernels before each layer, so the stream's queue is full while the stream
waits for the host's flag. Each run is a child process with a time limit, so a
stall fails the test instead of hanging the suite. Skipped without CUDA."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parent.parent
CHILD = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {tests!r})
    import runtime
    from moe_models import make_moe, split_plan

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    ids = torch.randint(0, model.config.vocab_size, (8, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits.float()
    model = model.cuda()
    flood = torch.zeros(1, device="cuda")

    def fill_the_queue(module, args):  # thousands of tiny kernels before each decoder layer
        for _ in range({kernels}):
            flood.add_(0)

    hooks = [layer.register_forward_pre_hook(fill_the_queue) for layer in model.model.layers]
    from runtime import cpu_experts
    compute = cpu_experts.host_rows

    def slow_host_rows(*args, **kwargs):  # the host's part takes long: the stream waits, the queue fills behind it
        time.sleep({host_s})
        return compute(*args, **kwargs)

    cpu_experts.host_rows = slow_host_rows
    plan = split_plan(model, lambda n: {{"cpu": list(range(n))}})
    with runtime.apply(plan, model, device="cuda") as handle:
        assert handle._splits.worker is not None, "no host thread on this GPU"
        for _ in range(3):
            with torch.no_grad():
                got = model(ids.cuda()).logits.float().cpu()
        torch.cuda.synchronize()
    for h in hooks:
        h.remove()
    # the host computes in its own rounding: as close as the cpu backend's tests hold it on the CPU
    assert (got - want).abs().max() < 0.1, (got - want).abs().max()
    print("done")
""")


@pytest.mark.parametrize("kernels", [0, 4000])
def test_the_host_thread_finishes_while_the_issuing_thread_fills_the_queue(kernels):
    code = CHILD.format(tests=str(ROOT / "tests"), kernels=kernels, host_s=0.05 if kernels else 0.0)
    try:
        run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], cwd=ROOT, capture_output=True,
                             text=True, timeout=180)
    except subprocess.TimeoutExpired as stalled:
        pytest.fail(f"the forward stalled ({kernels} kernels a layer before it): {stalled.stderr}")
    assert run.returncode == 0 and run.stdout.strip().endswith("done"), run.stderr[-3000:]


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "olmoe"])
def test_gpu_and_uva_experts_give_the_resident_models_logits_bit_for_bit(arch):
    """Experts split between GPU memory and UVA (no host part: the plan ``--routing`` makes for hot experts): one
    pass over both parts (runtime.expert_math.parts_rows) gives the resident model's logits exactly, eager and in
    CUDA graph replay (against the resident model replayed: under capture transformers passes SDPA a mask, whose
    kernel rounds otherwise than the unmasked one, so the resident model's own replay differs from its eager
    forward: OLMoE's did on the H200), at a decode step of 8 tokens and a prefill of 8 x 32."""
    sys.path.insert(0, str(ROOT / "tests"))
    import runtime
    from layer_graphs_check import replayed
    from moe_models import make_moe, split_plan

    model = make_moe(arch, implementation="grouped_mm").cuda()
    experts = model.config.num_experts if hasattr(model.config, "num_experts") else model.config.num_local_experts
    ids = torch.randint(0, model.config.vocab_size, (8, 32), generator=torch.Generator().manual_seed(2)).cuda()
    inputs = (ids[:, :1], ids)
    with torch.inference_mode():
        want = [(model(x, use_cache=False).logits, replayed(model, x)) for x in inputs]
    places = lambda n: {"gpu": list(range(0, n, 3)), "uva": [e for e in range(n) if e % 3]}  # noqa: E731
    with runtime.apply(split_plan(model, places), model, device="cuda"), torch.inference_mode():
        for x, (eager, in_graph) in zip(inputs, want):
            assert torch.equal(model(x, use_cache=False).logits, eager)
            assert torch.equal(replayed(model, x), in_graph)
    assert experts > 3


def _guarded_outputs(monkeypatch, host_turn=None, slow_s: float = 0.0):
    """12 forwards of a split Qwen3-MoE layout on the GPU (their logits), the resident model's, and the guards'
    summaries; the host's part made ``slow_s`` slower a call, or the guard's turn replaced by ``host_turn``."""
    sys.path.insert(0, str(ROOT / "tests"))
    import time

    import runtime
    from moe_models import make_moe, split_plan
    from runtime import cpu_experts, host_guard

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    ids = torch.randint(0, model.config.vocab_size, (8, 1), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).logits.float()
    model = model.cuda()
    compute = cpu_experts.host_rows

    def slow_host_rows(*args, **kwargs):
        time.sleep(slow_s)
        return compute(*args, **kwargs)

    if slow_s:
        monkeypatch.setattr(cpu_experts, "host_rows", slow_host_rows)
    if host_turn is not None:
        monkeypatch.setattr(host_guard.HostGuard, "host_turn", host_turn)
    with runtime.apply(split_plan(model), model, device="cuda") as handle, torch.no_grad():
        assert handle._splits.guards, "no guard on this GPU"
        outs = []
        for _ in range(12):
            outs.append(model(ids.cuda()).logits.float().cpu())
            torch.cuda.synchronize()
        summary = handle._splits.host_levels()
    return outs, want, summary


def test_a_late_host_sends_its_experts_through_uva(monkeypatch):
    """runtime/host_guard.py with real CUDA events: a host part made 30 ms slower a layer (slower than the link for
    any of its experts) sends them all through UVA, and the logits stay as close to the resident model's as the cpu
    backend holds them. (A host on time is not asserted here: on a tiny model the host's hand-off outlasts the GPU's
    reads, so the guard rightly moves experts there too; tests/test_host_guard.py covers a host on time.)"""
    outs, want, summary = _guarded_outputs(monkeypatch, slow_s=0.03)
    assert all((got - want).abs().max() < 0.1 for got in outs)
    assert all(s["all_uva_calls"] > 0 for s in summary.values()), summary


def test_a_level_between_the_host_and_the_link_gives_the_same_logits(monkeypatch):
    """Half of each layer's host experts read through UVA (offset views of the pinned memory) in a pass of their
    own, the other half on the host: the logits within the cpu backend's tolerance of the resident model's."""
    outs, want, summary = _guarded_outputs(monkeypatch, host_turn=lambda guard: guard.host // 2)
    assert all((got - want).abs().max() < 0.1 for got in outs)
    assert all(s["planned"] >= 2 for s in summary.values())


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_with_a_host_that_slows_down(monkeypatch, cache):
    """``generate()`` (greedy; the dynamic cache, or the static one without compile as the README says to run host
    experts) under a plan with host experts whose host part is 5 ms late a call:
    the prefill above ``cpu_max_tokens`` reads the host's experts through UVA, each decode step's layers move
    experts to the link by measurement, the run finishes, and each token the plan picks is one the resident model
    scores within the cpu backend's tolerance of its own best at that position (teacher-forced on the plan's
    sequence): host kernels round otherwise, so a near tie may go the other way, and nothing further."""
    sys.path.insert(0, str(ROOT / "tests"))
    import time

    import runtime
    from moe_models import make_moe, split_plan
    from runtime import cpu_experts

    model = make_moe("qwen3_moe", implementation="grouped_mm").cuda()
    prompt = torch.randint(0, model.config.vocab_size, (4, 8), generator=torch.Generator().manual_seed(5)).cuda()
    compute = cpu_experts.host_rows

    def late_host_rows(*args, **kwargs):
        time.sleep(0.005)
        return compute(*args, **kwargs)

    monkeypatch.setattr(cpu_experts, "host_rows", late_host_rows)
    with runtime.apply(split_plan(model, cpu_max_tokens=16), model, device="cuda") as handle, torch.inference_mode():
        extra = {"cache_implementation": "static", "disable_compile": True} if cache == "static" else {}
        out = model.generate(prompt, max_new_tokens=24, do_sample=False, min_new_tokens=24, **extra)
        summary = handle._splits.host_levels()
    assert out.shape == (4, 8 + 24)
    assert all(s["moved_calls"] > 0 for s in summary.values()), summary
    with torch.inference_mode():
        logits = model(out, use_cache=False).logits.float()[:, 7:-1]  # the resident model's scores of each pick
    picked = logits.gather(-1, out[:, 8:].unsqueeze(-1)).squeeze(-1)
    assert (logits.max(-1).values - picked).max().item() < 0.1


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "olmoe"])
def test_eager_decode_calls_replay_expert_graphs_bit_for_bit(arch):
    """runtime/shape_graphs.py on the GPU for a plan splitting the experts between GPU memory and UVA: what
    tests/layer_graphs_check.py's ``check_layer_graphs`` holds (the launched plan's and the resident model's logits
    bit for bit, one graph a shape a split layer, none under autograd, whole-model capture and generate() as without
    the graphs)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from layer_graphs_check import check_layer_graphs
    from moe_models import make_moe, split_plan

    model = make_moe(arch, implementation="grouped_mm").cuda()
    places = lambda n: {"gpu": list(range(0, n, 3)), "uva": [e for e in range(n) if e % 3]}  # noqa: E731
    check_layer_graphs(model, split_plan(model, places), lambda handle: [f for _, _, f in handle._splits.forwards])


def test_a_replay_on_another_stream_waits_for_the_pools_last_replay():
    """Two eager decode steps of different inputs on two streams, the first held back on the GPU (a sleep queued
    before it): each step's logits are its own inputs' (runtime/shape_graphs.py ``GraphPool.order``: the second
    stream's copies into the layer graphs' static inputs wait for the first stream's replays)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import runtime
    from moe_models import make_moe, split_plan

    model = make_moe("qwen3_moe", implementation="grouped_mm").cuda()
    a, b = (torch.randint(0, model.config.vocab_size, (2, 1), generator=torch.Generator().manual_seed(s)).cuda()
            for s in (11, 12))
    with torch.inference_mode():
        want = [model(x, use_cache=False).logits.clone() for x in (a, b)]
    places = lambda n: {"gpu": list(range(0, n, 3)), "uva": [e for e in range(n) if e % 3]}  # noqa: E731
    with runtime.apply(split_plan(model, places), model, device="cuda") as handle, torch.inference_mode():
        model(a, use_cache=False), model(a, use_cache=False)  # the shape's graphs captured
        assert handle.stats()["expert_graphs"]["graphs"] > 0
        first, second = torch.cuda.Stream(), torch.cuda.Stream()
        for s in (first, second):
            s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(first):
            torch.cuda._sleep(500_000_000)  # the first step runs a good while after it is issued
            got_a = model(a, use_cache=False).logits
        with torch.cuda.stream(second):
            got_b = model(b, use_cache=False).logits
        torch.cuda.synchronize()
    assert torch.equal(got_a, want[0]) and torch.equal(got_b, want[1])
