"""`planner explain PLAN --measured STATS.json`: the prediction next to what the runtime measured.

Per prefetched layer, the predicted copy time and stall (``planner.cost.timeline``) against the
measured ones (``schemas.measured``, from ``Handle.stats()``), the largest misses first,
and the totals. The measured figure of each field is the median over the forwards in the
file, leaving out the first when there are several (it carries the warm-up). A time the
runtime did not measure (a run on the CPU, a CUDA graph replay) is shown as not measured
and never counted as a miss.

Memory: the forward's peak GPU bytes as the plan counts them (weights and buffers, the forward's KV cache
and activations, the workspace: its ``memory`` section) against the largest ``max_memory_allocated`` the
runtime measured over the forwards used, with the plan's parts beside it.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field

from schemas.errors import InputError, suggest
from schemas.expert_graphs import graphs_on
from schemas.hardware_profile import HardwareProfile
from schemas.measured import MeasuredForward, MeasuredStats
from schemas.plan import Plan
from schemas.plan_memory import PART_WORDS
from schemas.sizes import format_bytes

from planner.cost.layer import layer_work
from planner.cost.predict import plan_sequences, timeline

MISSES_SHOWN = 10


def ratio(predicted: float | None, measured: float | None) -> float | None:
    """measured / predicted; None when either is missing or nothing was predicted."""
    if predicted is None or measured is None or predicted <= 0:
        return None
    return measured / predicted


@dataclass(frozen=True)
class Compared:
    """One figure, predicted and measured (None: not measured)."""

    what: str
    predicted: float
    measured: float | None

    @property
    def ratio(self) -> float | None:
        return ratio(self.predicted, self.measured)

    @property
    def miss(self) -> float | None:
        return None if self.measured is None else self.measured - self.predicted


@dataclass(frozen=True)
class LayerComparison:
    name: str
    bytes: Compared
    copy_ms: Compared
    stall_ms: Compared


@dataclass(frozen=True)
class Miss:
    layer: str
    figure: Compared


@dataclass
class Explanation:
    plan_model: str
    backend: str
    workload: str
    tokens: int
    hardware: str
    forwards_in_file: int
    forwards_used: int
    layers: list[LayerComparison] = field(default_factory=list)
    totals: list[Compared] = field(default_factory=list)  # step, copy, stall (ms), bytes copied, link GB/s
    memory: list[Compared] = field(default_factory=list)  # the peak GPU bytes, then the plan's parts (predicted)
    notes: list[str] = field(default_factory=list)

    def misses(self, limit: int = MISSES_SHOWN) -> list[Miss]:
        """Measured copy and stall times that differ from the prediction, largest difference first."""
        found = [Miss(row.name, c) for row in self.layers for c in (row.copy_ms, row.stall_ms)
                 if c.miss is not None and c.miss != 0]
        found.sort(key=lambda m: -abs(m.figure.miss or 0.0))
        return found[:limit]


def _median(values: list[float | int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(statistics.median(known)) if known else None


def _used(stats: MeasuredStats) -> list[MeasuredForward]:
    return stats.forwards[1:] if len(stats.forwards) > 1 else stats.forwards


def _check_layers(plan: Plan, stats: MeasuredStats, source: str) -> None:
    """Every measured layer must be a prefetched layer of the plan; else the file is from another plan."""
    names = [layer.name for layer in plan.layers]
    prefetched = {layer.name: sum(layer.params[rel].bytes for rel in layer.prefetched)
                  for layer in plan.layers if layer.prefetch is not None}
    problems = []
    for i, forward in enumerate(stats.forwards):
        for j, layer in enumerate(forward.layers):
            planned = prefetched.get(layer.name)
            if planned is not None:
                if layer.bytes % planned if planned else layer.bytes:
                    problems.append(f"{source}: forwards[{i}].layers[{j}].bytes: expected the plan's {planned} "
                                    f"bytes of '{layer.name}' (or a whole multiple, for a layer copied again, "
                                    f"or 0), got {layer.bytes}; were these stats measured with another plan?")
                continue
            where = f"{source}: forwards[{i}].layers[{j}].name"
            if layer.name in names:
                problems.append(f"{where}: layer '{layer.name}' is not prefetched in the plan; "
                                "were these stats measured with another plan?")
            else:
                problems.append(f"{where}: layer '{layer.name}' is not in the plan"
                                f"{suggest(layer.name, sorted(prefetched))}; "
                                "were these stats measured with another plan or model?")
    if problems:
        raise InputError(problems)


def explain(plan: Plan, stats: MeasuredStats, hw: HardwareProfile, workload: str, tokens: int,
            source: str = "STATS.json") -> Explanation:
    """Compare ``plan``'s predicted forward at ``tokens`` on ``hw`` with the measured ``stats``."""
    if stats.backend != plan.summary.backend:
        raise InputError(f"{source}: backend: the stats come from a '{stats.backend}' run but the plan's "
                         f"backend is '{plan.summary.backend}'; measure with this plan")
    _check_layers(plan, stats, source)
    used = _used(stats)
    t = timeline(plan, hw, tokens, plan_sequences(plan, workload, tokens))
    out = Explanation(plan.summary.model, plan.summary.backend, workload, tokens, hw.name,
                      len(stats.forwards), len(used))
    predicted_bytes = 0
    for layer, lt in zip(plan.layers, t.layers):
        if layer.prefetch is None or layer.prefetch.once:  # a layer copied once, at apply time: no copy per forward
            continue
        work = layer_work(layer, tokens, hw, graphs=graphs_on(plan.memory))
        predicted_bytes += work.copy_bytes
        measured = [m for f in used for m in f.layers if m.name == layer.name]
        row = LayerComparison(
            layer.name,
            Compared("bytes", work.copy_bytes, _median([m.bytes for m in measured])),
            Compared("copy ms", work.copy_ms, _median([m.copy_ms for m in measured])),
            Compared("stall ms", lt.stall, _median([m.stall_ms for m in measured])),
        )
        out.layers.append(row)
    out.totals = [
        Compared("step ms", t.step_ms, _median([f.step_ms for f in used])),
        Compared("copy ms", t.copy_ms, _median([f.copy_ms for f in used])),
        Compared("stall ms", t.stall_ms, _median([f.stall_ms for f in used])),
        Compared("bytes copied", predicted_bytes, _median([f.bytes_copied for f in used])),
        Compared("link GB/s", hw.h2d_gbps, _median([f.copy_gbps for f in used])),
    ]
    out.memory = _memory(plan, workload, used, stats)
    if all(c.measured is None for row in out.layers for c in (row.copy_ms, row.stall_ms)) and out.layers:
        out.notes.append("no copy or stall was timed (a run on the CPU, or stats off): only bytes are compared")
    if out.totals[0].measured is None:
        out.notes.append("no measured step time: add step_ms to each forward to compare the step")
    return out


def _memory(plan: Plan, workload: str, used: list[MeasuredForward], stats: MeasuredStats) -> list[Compared]:
    """The forward's peak as the plan counts it, against the largest peak measured; then the plan's parts, the
    layer graphs against what the stats say they hold (their static tensors and their pool's segments)."""
    s, mem = plan.summary, plan.memory
    peaks = [f.max_memory_allocated for f in used if f.max_memory_allocated is not None]
    measured = float(max(peaks)) if peaks else None
    parts = [("weights and buffers", s.resident_bytes + s.buffer_bytes, None)]  # (what, counted, measured)
    forward = mem.forward(workload) if mem is not None else None
    if mem is not None:
        kv = forward.kv_cache_bytes if forward is not None and mem.kv_cache == "workload" else mem.kv_cache_bytes
        act = forward.activation_bytes if forward is not None and mem.activations == "model" else mem.activation_bytes
        of_forward = {"kv_cache_bytes": kv, "activation_bytes": act}  # the workload's own where sized by it
        g = stats.expert_graphs
        held = {"graph_bytes": float(g.bytes + g.pool_bytes)} if g is not None else {}  # as the stats say
        parts += [(PART_WORDS[name], of_forward.get(name, n), held.get(name)) for name, n in mem.parts(listed=True)]
    rows = [Compared("peak GPU bytes", sum(n for _, n, _ in parts), measured)]
    return rows + [Compared(f"  {what}", n, got) for what, n, got in parts]


# ---------------------------------------------------------------------------
# Wording.


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if digits == 0 else f"{value:.{digits}f}"


def _ratio(c: Compared) -> str:
    r = c.ratio
    if r is None:
        return "-" if c.measured is None or c.measured == 0 else "n/a (0 predicted)"
    return f"x{r:.2f}"


def _grid(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths)))
            .rstrip() for r in rows]


def render_text(e: Explanation, source: str) -> str:
    tokens = f"{e.tokens} token{'s' * (e.tokens != 1)}"
    left_out = " (the first left out: warm-up)" if e.forwards_used < e.forwards_in_file else ""
    out = [f"{e.plan_model} ({e.backend}): predicted on {e.hardware} for {e.workload} ({tokens}) vs "
           f"{source}, median of {e.forwards_used} of {e.forwards_in_file} forwards{left_out}",
           "(the measured run must have pushed the same tokens: choose with --workload)", ""]
    out += _grid([["total", "predicted", "measured", "ratio"]]
                 + [[c.what, _num(c.predicted, 0 if c.what == "bytes copied" else 3),
                     _num(c.measured, 0 if c.what == "bytes copied" else 3), _ratio(c)] for c in e.totals],
                 right={1, 2, 3})
    if e.memory:
        peak = e.memory[0]
        out += ["", "GPU memory (bytes; measured: the largest max_memory_allocated of the forwards used):"]
        out += _grid([["memory", "predicted", "measured", "ratio"]]
                     + [[c.what, f"{format_bytes(int(c.predicted))} ({_num(c.predicted, 0)})",
                         "-" if c.measured is None else f"{format_bytes(int(c.measured))} ({_num(c.measured, 0)})",
                         _ratio(c) if c is peak else ""] for c in e.memory], right={1, 2, 3})
        if peak.measured is None:
            out.append("(no peak measured: runtime.apply(..., stats=True) on CUDA records max_memory_allocated)")
    if e.layers:
        out += ["", "per prefetched layer (ms):"]
        head = ["layer", "bytes", "copy pred", "copy meas", "ratio", "stall pred", "stall meas", "ratio"]
        out += _grid([head] + [[r.name, _num(r.bytes.predicted, 0), _num(r.copy_ms.predicted),
                                _num(r.copy_ms.measured), _ratio(r.copy_ms), _num(r.stall_ms.predicted),
                                _num(r.stall_ms.measured), _ratio(r.stall_ms)] for r in e.layers],
                     right=set(range(1, 8)))
    misses = e.misses()
    if misses:
        out += ["", "largest misses:"]
        for m in misses:
            c = m.figure
            out.append(f"  {m.layer} {c.what.split()[0]}: predicted {c.predicted:.3f} ms, measured "
                       f"{c.measured:.3f} ms ({c.miss:+.3f} ms, {_ratio(c)})")
    elif e.layers:
        out += ["", "no measured layer time differs from the prediction"]
    out += [f"note: {n}" for n in e.notes]
    return "\n".join(out) + "\n"


def _compared(c: Compared) -> dict:
    return asdict(c) | {"ratio": c.ratio, "miss": c.miss}


def render_json(e: Explanation) -> str:
    data = {k: v for k, v in asdict(e).items() if k not in ("layers", "totals", "memory")}
    data["totals"] = [_compared(c) for c in e.totals]
    data["memory"] = [_compared(c) | {"what": c.what.strip()} for c in e.memory]
    data["layers"] = [{"name": r.name, "bytes": _compared(r.bytes), "copy_ms": _compared(r.copy_ms),
                       "stall_ms": _compared(r.stall_ms)} for r in e.layers]
    data["misses"] = [{"layer": m.layer, **_compared(m.figure)} for m in e.misses()]
    return json.dumps(data, indent=2) + "\n"
