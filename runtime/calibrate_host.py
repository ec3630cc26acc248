"""The host CPU's figures for the cpu backend (``planner calibrate``; schemas/hardware.py ``host_*``).

Measured as the backend runs: ``runtime.expert_math.host_rows`` (the padded pass) on the backend's own host
thread (``runtime.host_worker.HostWorker``, its thread count), over a host part of 64 of a layer's 128
Qwen3-MoE-shaped experts (hidden 2048, width 768, bf16: 604 MB), each call routed afresh at random (top-8, as a
decode step of that many tokens is), so that the rows each expert sees, the padding and the runs of touched
experts vary from call to call as they do in a forward:

- ``host_expert_gbps``: at 1, 8, 32 and 64 tokens (by the rows a touched expert saw on average), GB/s of the
  touched experts' weights beyond what a touched expert costs there (``expert_us``), both solved from the part and
  a second part of 16 experts four times as wide in a layer of as many experts routed alike, so that an expert
  of either part sees the same rows in distribution (two sizes, two unknowns);
- ``host_expert_us``: that cost at 32 tokens, for a point that gives none;
- ``host_tflops``: the arithmetic rate at 4,096 tokens (compute-bound);
- ``host_call_us``: a call over tiny experts (the sort, the copies, the Python) plus, on a GPU machine, the round
  trip of the routing to the host and the rows back;
- ``host_link_share``: the rate at 32 tokens while GPU kernels read pinned host memory through UVA, as a share of
  the rate alone.

A first version measured 32 experts each seeing exactly the same rows on the issuing thread: 54 GB/s at two rows
on the H200's host, where a forward's host part ran at about 35 (bench/results/hybrid-h200-2026-12-01/).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import torch
from torch import nn

from runtime.expert_math import Layout, host_rows, rows_dtype
from runtime.timing import wall_ms
from runtime.uva import device_view
from schemas.hardware_profile import HostRatePoint

HIDDEN, WIDTH, EXPERTS, PART, TOP_K = 2048, 768, 128, 64, 8
MODULE_LAYOUT = Layout("gate_up_proj", True, False, False, False, False)  # Qwen3-MoE's experts module
TOKENS = (1, 8, 32, 64)
ROUTINGS = 6  # calls timed at each token count, each its own routing
SMALL_CALLS = 8  # below this many tokens, ROUTINGS times this many over the tokens (calls_at)


class _Experts(nn.Module):
    """What ``host_rows`` reads of an experts module (transformers' default gate: silu(gate) * up)."""

    def __init__(self) -> None:
        super().__init__()
        self.act_fn = nn.SiLU()

    def _apply_gate(self, a: torch.Tensor) -> torch.Tensor:
        gate, up = a.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class _Part:
    """A host part of ``experts`` of ``total`` experts (the first ones), with random routings to call it with."""

    def __init__(self, experts: int, total: int, hidden: int, width: int, seed: int = 0, top_k: int = TOP_K) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.module, self.layout = _Experts(), MODULE_LAYOUT.for_host()
        up = (torch.randn(experts, 2 * width, hidden, generator=self.g) / 40).to(torch.bfloat16)  # [E, out, in]
        down = (torch.randn(experts, hidden, width, generator=self.g) / 40).to(torch.bfloat16)
        self.weights = {name: w.transpose(-2, -1).contiguous() if name in MODULE_LAYOUT.flipped(self.layout) else w
                        for name, w in (("gate_up_proj", up), ("down_proj", down))}  # the host's layout
        self.per_expert = (2 * width * hidden + width * hidden) * 2
        self.experts, self.total, self.hidden, self.top_k = experts, total, hidden, top_k
        self.table = torch.full((total,), experts, dtype=torch.long)
        self.table[:experts] = torch.arange(experts)

    def call(self, tokens: int) -> tuple[Callable[[], None], torch.Tensor]:
        """One call at ``tokens`` tokens, routed afresh: (the call, the rows each of the part's experts sees)."""
        index = torch.rand(tokens, self.total, generator=self.g).argsort(dim=-1)[:, :self.top_k]
        routing = torch.softmax(torch.randn(tokens, self.top_k, generator=self.g), -1).to(torch.bfloat16)
        hidden_states = torch.randn(tokens, self.hidden, generator=self.g).to(torch.bfloat16)

        def run() -> None:
            out = torch.zeros(index.numel(), self.hidden, dtype=rows_dtype(hidden_states, routing))
            host_rows(self.module, self.layout, self.weights, self.table, hidden_states, index, routing, out)

        return run, torch.bincount(index[index < self.experts], minlength=self.experts)

    def calls(self, tokens: int, count: int) -> list[tuple[Callable[[], object], int, float]]:
        """``count`` calls at ``tokens`` tokens: (the call, the bytes of the experts it touches, rows a touched
        expert sees)."""
        made = []
        for _ in range(count):
            run, counts = self.call(tokens)
            touched = int((counts > 0).sum())
            made.append((run, touched * self.per_expert, int(counts.sum()) / max(touched, 1)))
        return made


def _timed(part: _Part, calls: list[tuple[Callable[[], object], int, float]], fixed_ms: float) -> tuple[float, float, float]:
    """(ms beyond the fixed cost, bytes read, experts touched) over the calls, each called once, after one call of
    another routing."""
    calls[0][0]()
    ms = 0.0
    for run, _, _ in calls[1:]:
        t0 = time.perf_counter()
        run()
        ms += max((time.perf_counter() - t0) * 1e3 - fixed_ms, 1e-3)
    nbytes = sum(b for _, b, _ in calls[1:])
    return ms, nbytes, nbytes / part.per_expert


def _round_trip_us(device: torch.device) -> float:
    """The routing of 32 tokens to the host and their rows back, with the wait between (GPU machines)."""
    if device.type != "cuda":
        return 0.0
    dev = torch.randn(32 * TOP_K, HIDDEN, dtype=torch.bfloat16, device=device)
    host = torch.empty(32, HIDDEN, dtype=torch.bfloat16, pin_memory=True)
    back = torch.empty_like(dev, device="cpu").pin_memory()

    def trip() -> None:
        host.copy_(dev[:32], non_blocking=True)
        torch.cuda.current_stream(device).synchronize()
        dev.copy_(back, non_blocking=True)

    return wall_ms(trip, repeat=20) * 1e3


def _with_uva(device: torch.device, fn: Callable[[], object]) -> object | None:
    """``fn()`` while GPU kernels read 2 GiB of pinned host memory through UVA (None without CUDA)."""
    if device.type != "cuda":
        return None
    host = torch.full((2**30 // 8192, 8192), 0.001, dtype=torch.bfloat16).pin_memory()
    view = device_view(host, device)
    x = torch.randn(1, 8192, dtype=torch.bfloat16, device=device)
    torch.cuda.synchronize(device)
    for _ in range(8):
        x @ view.T
    try:
        return fn()
    finally:
        torch.cuda.synchronize(device)


def _on_host_thread(fn: Callable[[], object]) -> object:
    """``fn()`` on the backend's host thread (its thread count), as the runtime calls the host's part."""
    from runtime.host_worker import HostWorker, host_threads

    worker, done, result = HostWorker(max(1, host_threads() - 1)), threading.Event(), []

    def job() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
            result.append(exc)
        finally:
            done.set()

    worker.submit(job)
    done.wait()
    worker.close()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def host_experts(device: torch.device) -> dict[str, object]:
    """The ``host_*`` figures of a hardware profile, measured here (on a GPU machine on the backend's host thread;
    else on this thread, as the runtime computes there)."""
    if device.type != "cuda":
        return _figures(device)
    return _on_host_thread(lambda: _figures(device))


def bytes_rate(nbytes: int, ms: float, fixed_ms: float) -> float:
    """GB/s of ``nbytes`` read in ``ms`` less the touched experts' own cost ``fixed_ms``; that cost comes from two
    noisy timings (``_figures``), so it is taken at most half the time: the rate is at most twice the plain one
    (a cost that took it all once gave 3,010,461 GB/s on the H200's host, 2026-12-01, and the run stopped)."""
    return nbytes / max(ms - fixed_ms, ms / 2, 1e-6) / 1e6


def _expert_ms(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """What a touched expert costs beyond its bytes, from ``_timed``'s (ms, bytes, experts touched) of two parts
    whose experts differ in size (two timings, two unknowns: that cost and the bytes' rate); 0 where the timings'
    noise makes it negative."""
    (ms_a, bytes_a, n_a), (ms_b, bytes_b, n_b) = a, b
    det = n_a * bytes_b - n_b * bytes_a
    return max(0.0, (ms_a * bytes_b - ms_b * bytes_a) / det) if det else 0.0


def calls_at(tokens: int) -> int:
    """Calls timed at ``tokens`` tokens: ``ROUTINGS``, more at a few tokens, where a call touches a few experts in
    well under a millisecond (at 1 token about 4 of the part's, 38 MB), so each point reads about as many bytes."""
    return ROUTINGS * max(1, SMALL_CALLS // tokens)


def call_fixed_ms(small: _Part, routings: int = 5) -> float:
    """A call's cost beyond its experts: the least of ``routings`` tiny calls' median times (a transient only adds
    to it, and every timed call has this subtracted: a median once taken from calls slowed to 12 ms on a freshly
    started H200 machine made the host's figures 58,290 GB/s, bench/results/bundled-h200-2026-12-04g/)."""
    return min(wall_ms(run, repeat=3) for run, _, _ in small.calls(4, routings))


def parts() -> tuple[_Part, _Part, _Part]:
    """The parts calibrate times: tiny experts (a call's fixed cost), the part, and experts 4x wider.

    The wide part's experts are of a layer of as many experts routed alike (top 8 of 128), so that an expert of
    either part sees the same rows in distribution and takes the kernel's passes as often: at each point the two
    give what a touched expert costs beyond its bytes there and the bytes' rate. (A layer of 112 gave the wide
    experts 1.52 passes at 64 tokens against the part's 1.40, and the solve 4-row points of 38.6 and 41.5 GB/s with
    no cost of their own: bench/results/host-figures-h200-2026-12-04h/, calibrate-h200-2026-12-04i/. At 1 row the
    cost is most of a small expert's time, and a rate taken with 32 tokens' cost read Phi-3.5-MoE's 157 MB experts
    at 70 GB/s where the kernel read them at 115-125: docs/BENCHMARKS.md, 2026-12-04.)"""
    return (_Part(8, 16, 64, 32, seed=1), _Part(PART, EXPERTS, HIDDEN, WIDTH),
            _Part(PART // 4, EXPERTS, HIDDEN, 4 * WIDTH, seed=2))


def _figures(device: torch.device) -> dict[str, object]:
    small, part, wide = parts()
    for first in (small, part, wide):  # first calls (the kernel's build, its threads' start) are not timed
        first.call(8)[0]()
    fixed_ms = call_fixed_ms(small)
    measured = {}
    for tokens in TOKENS:
        calls = part.calls(tokens, calls_at(tokens))
        narrow = _timed(part, calls, fixed_ms)
        wider = _timed(wide, wide.calls(tokens, calls_at(tokens)), fixed_ms)
        each = _expert_ms(narrow, wider)
        rows = statistics.mean(r for _, _, r in calls[1:])
        gbps = bytes_rate(narrow[1] + wider[1], narrow[0] + wider[0], (narrow[2] + wider[2]) * each)
        measured[tokens] = (rows, gbps, each)
    points = sorted(measured.values())
    expert_ms = measured.get(32, points[0])[2]  # the profile's figure for points that give none: 32 tokens'
    merged = [HostRatePoint(tokens=max(1, round(rows)), gbps=round(gbps, 3), expert_us=round(each * 1e3, 3))
              for rows, gbps, each in points]
    merged = [p for i, p in enumerate(merged) if i == 0 or p.tokens > merged[i - 1].tokens]
    big = part.calls(4096, 2)
    flops = sum(2.0 * rows * (touched // part.per_expert) * 3 * WIDTH * HIDDEN for _, touched, rows in big[1:])
    ms, _, _ = _timed(part, big, fixed_ms)
    figures: dict[str, object] = {"host_expert_gbps": merged, "host_expert_us": expert_ms * 1e3,
                                  "host_tflops": flops / ms / 1e9,
                                  "host_call_us": fixed_ms * 1e3 + _round_trip_us(device)}
    ms, nbytes, _ = _timed(part, part.calls(32, ROUTINGS), fixed_ms)
    busy = _with_uva(device, lambda: _timed(part, part.calls(32, ROUTINGS), fixed_ms))
    if busy is not None:
        figures["host_link_share"] = min(1.0, max(0.05, (busy[1] / busy[0]) / (nbytes / ms)))
    return figures
