"""Running one contender of bench_compare.py: a fresh copy of the model, its setup, timed steps per
workload and mode, one JSON line per measurement, and its teardown; a failure becomes an error row.

Every contender starts from an identical copy of the model on the device (the floor uses the original)
and its setup moves what it offloads to the host, as its documentation says. GPU peak is
``max_memory_allocated`` during the timed steps minus what the harness holds (the original model, the
inputs, the floor's logits); host memory added is measured from /proc/meminfo and /proc/self/status
before the copy and after setup and each workload.
"""

from __future__ import annotations

import copy
import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from compare_measure import (Steps, compare, gpu_allocated, gpu_peak, host_added, host_snapshot, release, reset_peak,
                             time_steps)
from compare_profile import profile_step


class Skip(Exception):
    """Raised by a setup that cannot run here (e.g. needs CUDA): its rows say skipped, with the reason."""


@dataclass
class Applied:
    """What a contender's setup returns."""

    model: nn.Module
    info: dict = field(default_factory=dict)
    teardown: Callable[[], None] | None = None


@dataclass
class Case:
    """One model of the comparison and what the floor measured on it."""

    key: str
    master: nn.Module
    config: object
    spec: object
    total_bytes: int
    budget: int
    inputs: dict[str, torch.Tensor]
    refs: dict[str, torch.Tensor] = field(default_factory=dict)
    floor_ms: dict[str, float] = field(default_factory=dict)
    floor_peak: dict[str, int] = field(default_factory=dict)
    link_bound_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class Run:
    device: torch.device
    out: object  # the open JSONL file
    time_budget_s: float
    slow_s: float = 8.0
    cap_s: float = 10.0
    h2d_gbps: float | None = None
    profile_dir: Path | None = None
    graph_max_tokens: int = 64  # CUDA graph replay only where launches matter: decode, not a long prefill
    start: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left_s(self) -> float:
        return self.time_budget_s - self.elapsed()

    def write(self, record: dict) -> None:
        self.out.write(json.dumps(record, default=str) + "\n")
        self.out.flush()


def eager(model: nn.Module, ids: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: model(ids, use_cache=False).logits


def graph(model: nn.Module, ids: torch.Tensor) -> Callable[[], torch.Tensor]:
    """CUDA graph replay of one forward on a static copy of ``ids`` (captured after two side-stream warm-ups)."""
    static = ids.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad():
        with torch.cuda.stream(side):
            for _ in range(2):
                model(static, use_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = model(static, use_cache=False).logits

    def step() -> torch.Tensor:
        g.replay()
        return out
    # keep the graph, and the input it reads, alive as long as the step: ``static`` was allocated outside the
    # graph's pool, so once freed the next allocation reuses its memory and a replay reads whatever lies there
    # (a probe's eager forward between two replays made the embedding gather out of range, 2026-12-02)
    step.graph, step.static = g, static
    return step


def compiled(model: nn.Module, ids: torch.Tensor) -> Callable[[], torch.Tensor]:
    """torch.compile (default mode); the first call compiles and is reported as first_call_s."""
    torch._dynamo.reset()
    cm = torch.compile(model)
    return lambda: cm(ids, use_cache=False).logits


MODES: dict[str, Callable] = {"eager": eager, "graph": graph, "compile": compiled}


def _fmt_gb(n: int | None) -> str:
    return "   -   " if n is None else f"{n / 1e9:6.2f}G"


def _print(row: dict) -> None:
    if row["status"] != "ok":
        print(f"{row['model']:5} {row['contender']:44} {row['workload']:8} {row['mode']:7} {row['status'].upper()}: "
              f"{row.get('error') or row.get('reason')}", flush=True)
        return
    link = row.get("ratio_link")
    print(f"{row['model']:5} {row['contender']:44} {row['workload']:8} {row['mode']:7} {row['step_ms']:10.2f} ms"
          f"  x{link if link is not None else '-':>6} link  peak {_fmt_gb(row.get('peak_gpu_bytes'))}"
          f"  host+ {_fmt_gb(row.get('host_added_bytes'))}  equal {row.get('equal')}"
          f" (max diff {row.get('max_abs_diff')})  n={len(row['times_ms'])}", flush=True)


def write_row(run: Run, row: dict) -> dict:
    """One row into the JSONL and onto stdout."""
    run.write(row)
    _print(row)
    return row


def skip_row(run: Run, case: Case, name: str, family: str, workload: str, reason: str,
             extra: dict | None = None) -> dict:
    """A row for a measurement not made (written and printed like the others)."""
    return write_row(run, {"type": "row", "model": case.key, "contender": name, "family": family,
                           "budget": case.budget, **(extra or {}), "workload": workload,
                           "tokens": int(case.inputs[workload].numel()), "mode": "eager",
                           "elapsed_s": round(run.elapsed(), 1), "status": "skipped", "reason": reason})


def run_contender(run: Run, case: Case, name: str, family: str, setup: Callable[[nn.Module], Applied],
                  workloads: list[str], *, modes: tuple[str, ...] = ("eager",), use_master: bool = False,
                  extra: dict | None = None, per_workload: dict[str, dict] | None = None,
                  profile: bool = False) -> dict[tuple[str, str], dict]:
    """Measure one contender on ``workloads`` x ``modes``; returns the rows written, by (workload, mode).
    ``extra`` goes into every row, ``per_workload[w]`` into the rows of workload ``w`` (e.g. a plan's
    prediction for it)."""
    base = {"type": "row", "model": case.key, "contender": name, "family": family, "budget": case.budget,
            **(extra or {})}
    own = per_workload or {}
    rows: dict[tuple[str, str], dict] = {}

    def emit(workload: str, mode: str, **fields) -> dict:
        row = {**base, **own.get(workload, {}), "workload": workload, "tokens": int(case.inputs[workload].numel()),
               "mode": mode, "elapsed_s": round(run.elapsed(), 1), **fields}
        rows[(workload, mode)] = write_row(run, row)
        return row

    if run.left_s() < 15:
        for w in workloads:
            for m in modes:
                emit(w, m, status="skipped", reason="time budget spent")
        return rows
    baseline = gpu_allocated(run.device)
    if use_master and baseline is not None:
        baseline -= case.total_bytes  # the floor's peak counts its weights
    h0 = host_snapshot()
    t0 = time.perf_counter()
    failed = False
    try:  # the copy is only an argument: when setup fails, it goes with the traceback at the end of except
        applied = setup(case.master if use_master else copy.deepcopy(case.master))
    except Exception as exc:  # noqa: BLE001 - a contender's failure is a result
        failed = True
        skipped = isinstance(exc, Skip)
        if not skipped:
            traceback.print_exc()
        for w in workloads:
            for m in modes:
                if skipped:
                    emit(w, m, status="skipped", reason=str(exc))
                else:
                    emit(w, m, status="error", error=f"setup: {exc!r}"[:500])
    if failed:
        release(run.device)
        return rows
    setup_s = round(time.perf_counter() - t0, 3)
    snaps = [host_snapshot()]
    allocated = gpu_allocated(run.device)
    resident = None if allocated is None else allocated - baseline
    info = dict(applied.info)
    for w in workloads:
        for m in modes:
            if m == "graph" and case.inputs[w].numel() > run.graph_max_tokens:
                continue
            if run.left_s() < 0:
                emit(w, m, status="skipped", reason="time budget spent")
                continue
            try:
                steps = _measure(run, applied.model, case.inputs[w], m)
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                emit(w, m, status="error", error=repr(exc)[:500], setup_s=setup_s)
                continue
            peak = gpu_peak(run.device)
            snaps.append(host_snapshot())
            equal, diff = compare(steps.output, case.refs.get(w))
            host = host_added(h0, *snaps)
            emit(w, m, status="ok", step_ms=round(steps.step_ms, 3), times_ms=steps.times_ms, warmups=steps.warmups,
                 first_call_s=steps.first_call_s, setup_s=setup_s, equal=equal, max_abs_diff=diff,
                 peak_gpu_bytes=None if peak is None else peak - baseline, resident_gpu_bytes=resident,
                 host_added_bytes=host.get("MemAvailable"), host=host, info=info,
                 **ratios(run, case, w, steps.step_ms, info.get("moved_bytes"),
                          own.get(w, {}).get("offloaded_bytes")))
            if profile and run.profile_dir is not None:
                _profile(run, case, name, applied.model, w)
                profile = False
            del steps
    try:
        if applied.teardown is not None:
            applied.teardown()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    del applied
    release(run.device)
    return rows


def _measure(run: Run, model: nn.Module, ids: torch.Tensor, mode: str) -> Steps:
    reset_peak(run.device)
    step = MODES[mode](model, ids)
    again = float("inf") if mode == "compile" else 1.0
    return time_steps(step, run.device, slow_s=run.slow_s, cap_s=run.cap_s, warm_again_s=again)


def ratios(run: Run, case: Case, workload: str, ms: float, moved: int | None, offloaded: int | None = None) -> dict:
    """A measured step against its bounds: the link bound of the case (what the budget forces over the link),
    the floor, and for a plan of ours the bound of its own plan, max(floor, offloaded bytes / link): how
    close the runtime comes to what its plan moves."""
    bound, floor = case.link_bound_ms.get(workload), case.floor_ms.get(workload)
    out = {"link_bound_ms": bound, "floor_ms": floor,
           "ratio_link": round(ms / bound, 3) if bound else None,
           "ratio_floor": round(ms / floor, 3) if floor else None, "moved_bytes": moved}
    if moved is not None and run.h2d_gbps:
        out["own_link_ms"] = round(moved / (run.h2d_gbps * 1e6), 3)
    if offloaded is not None and run.h2d_gbps:
        own = max(floor or 0.0, offloaded / (run.h2d_gbps * 1e6))
        out["own_bound_ms"] = round(own, 3) if own else None
        out["ratio_own"] = round(ms / own, 3) if own else None
    return out


def _profile(run: Run, case: Case, name: str, model: nn.Module, workload: str) -> None:
    path = run.profile_dir / f"profile-{case.key}-{name.replace(' ', '_').replace(':', '')}-{workload}.txt"
    try:
        summary = profile_step(eager(model, case.inputs[workload]), run.device, path)
        run.write({"type": "profile", "model": case.key, "contender": name, "workload": workload, **summary})
        print(f"profile of {name} on {workload}: {path}", flush=True)
        for op in summary["top"][:6]:
            print(f"    {op}", flush=True)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        run.write({"type": "profile", "model": case.key, "contender": name, "workload": workload,
                   "error": repr(exc)[:500]})
