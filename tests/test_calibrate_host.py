"""runtime/calibrate_host.py on tiny experts: the figures it measures, as the backend's host thread runs them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime import calibrate_host  # noqa: E402
from schemas.hardware import load_hardware  # noqa: E402


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(calibrate_host, "HIDDEN", 64)
    monkeypatch.setattr(calibrate_host, "WIDTH", 32)
    monkeypatch.setattr(calibrate_host, "TOKENS", (1, 8, 32))
    monkeypatch.setattr(calibrate_host, "ROUTINGS", 3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_figures_make_a_profile(tiny):
    figures = calibrate_host.host_experts(torch.device("cpu"))
    points = figures["host_expert_gbps"]
    assert [p.tokens for p in points] == sorted({p.tokens for p in points}) and points[0].tokens == 1
    assert all(p.gbps > 0 for p in points) and figures["host_expert_us"] >= 0 and figures["host_tflops"] > 0
    assert "host_link_share" not in figures  # no GPU: no UVA reads to share the host's memory with
    profile = load_hardware("h200").model_copy(update=figures)
    assert profile.host_gbps(1.0) == points[0].gbps
    assert all(p.expert_us is not None and p.expert_us >= 0 for p in points)  # each point its own expert cost
    assert profile.host_expert_us_at(1.0) == points[0].expert_us


def test_two_expert_sizes_give_the_expert_cost_and_the_rate():
    """``_expert_ms`` solves (cost a touched expert, rate) from two parts' timings: exact on timings made from
    known figures, 0 (not negative) where noise would make it so, and the rate beyond it is the known one."""
    expert_ms, per_ms = 0.05, 1 / 100e6  # 50 us an expert, 100 GB/s (ms a byte)
    narrow = (10 * expert_ms + 10 * 9e6 * per_ms, 10 * 9e6, 10)  # 10 experts of 9 MB
    wide = (3 * expert_ms + 3 * 36e6 * per_ms, 3 * 36e6, 3)  # 3 experts of 36 MB
    assert calibrate_host._expert_ms(narrow, wide) == pytest.approx(expert_ms)
    gbps = calibrate_host.bytes_rate(narrow[1] + wide[1], narrow[0] + wide[0], 13 * expert_ms)
    assert gbps == pytest.approx(100.0)
    assert calibrate_host._expert_ms(narrow, (wide[0] * 3, *wide[1:])) == 0.0  # the wide part slow: cost < 0
    assert calibrate_host._expert_ms(narrow, narrow) == 0.0  # one size: no solution


def test_few_tokens_are_timed_over_more_calls():
    assert calibrate_host.calls_at(1) > calibrate_host.calls_at(8) == calibrate_host.calls_at(64) == \
        calibrate_host.ROUTINGS


def test_a_part_s_calls_route_at_random_and_report_what_they_touch():
    part = calibrate_host._Part(4, 16, 16, 8)
    calls = part.calls(3, 5)
    assert len(calls) == 5 and all(0 <= b <= 4 * part.per_expert and b % part.per_expert == 0 for _, b, _ in calls)
    ms, nbytes, touched = calibrate_host._timed(part, calls, 0.0)
    assert ms > 0 and nbytes == sum(b for _, b, _ in calls[1:]) and touched == nbytes / part.per_expert


def test_the_host_thread_returns_and_raises_what_the_call_does():
    assert calibrate_host._on_host_thread(lambda: 7) == 7

    def fail():
        raise ValueError("on the host thread")

    with pytest.raises(ValueError, match="on the host thread"):
        calibrate_host._on_host_thread(fail)


@pytest.mark.parametrize("fixed_ms", [0.0, 0.4, 0.9999, 1.0, 3.0])
def test_the_bytes_rate_stays_within_twice_the_plain_rate(fixed_ms):
    """The experts' own cost comes from two noisy timings; when it takes (nearly) all of a call's time the rate
    stays a real machine's (it once came out at 3e6 GB/s and the profile refused it)."""
    plain = 10**9 / 1.0 / 1e6  # 1 GB in 1 ms
    rate = calibrate_host.bytes_rate(10**9, 1.0, fixed_ms)
    assert plain <= rate <= 2 * plain
    assert rate == pytest.approx(plain / (1 - fixed_ms) if fixed_ms <= 0.5 else 2 * plain)
    from schemas.hardware_profile import HostRatePoint

    HostRatePoint(tokens=1, gbps=round(rate, 3))  # a profile takes it


def test_the_fixed_cost_is_the_least_of_its_routings(monkeypatch):
    """Every timed call has the fixed cost subtracted, so one slowed by a transient must not set it (a median of
    slowed calls made the host's figures 58,290 GB/s on a fresh H200 machine)."""
    times = iter([12.0, 0.31, 11.5, 0.4, 0.35])
    monkeypatch.setattr(calibrate_host, "wall_ms", lambda run, repeat: next(times))
    assert calibrate_host.call_fixed_ms(calibrate_host._Part(4, 8, 16, 8), routings=5) == 0.31


def test_the_two_sizes_see_the_same_rows_and_passes(tiny):
    """The expert cost and the rate at a point come from two parts of different expert sizes; that solve holds only
    if an expert of either part sees the same rows (and so takes the host kernel's passes of 4 rows as often): at
    64 tokens a wide part in a layer of 112 experts took 1.52 passes against the part's 1.40 and the solve gave the
    4-row point no cost of its own twice on the H200's host."""
    import statistics

    from runtime import host_matmul

    _, part, wide = calibrate_host.parts()
    assert wide.total == part.total and wide.top_k == part.top_k and wide.per_expert == 4 * part.per_expert
    for tokens in (32, 64):
        rows = [statistics.mean(r for _, _, r in p.calls(tokens, 400)) for p in (part, wide)]
        passes = [statistics.mean(host_matmul.passes(p.call(tokens)[1]) for _ in range(400)) for p in (part, wide)]
        assert rows[1] == pytest.approx(rows[0], rel=0.03) and passes[1] == pytest.approx(passes[0], rel=0.03)
