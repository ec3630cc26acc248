"""What changed between two plans: params moved between GPU and host, settings, memory, schedule,
and the predicted step time per workload (only when both plans were predicted alike)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from schemas.plan import Plan
from schemas.prediction import Predictions
from schemas.sizes import format_bytes

from planner.names import compress_names

BYTE_FIELDS = ("gpu_budget_bytes", "cpu_budget_bytes", "total_bytes", "resident_bytes", "offloaded_bytes",
               "buffer_bytes", "peak_gpu_bytes", "pinned_host_bytes")
SETTINGS = ("backend", "strategy", "prefetch_step")
OTHER_SUMMARY = ("model", "spec_sha256", "layers", "offloaded_layers")


@dataclass(frozen=True)
class Change:
    field: str
    old: object
    new: object


@dataclass(frozen=True)
class MemoryDelta:
    field: str
    old: int | None
    new: int | None

    @property
    def delta(self) -> int:
        return (self.new or 0) - (self.old or 0)


@dataclass(frozen=True)
class TimeDelta:
    """The predicted step time of one workload in the old and the new plan."""

    workload: str
    tokens: int
    old_ms: float
    new_ms: float

    @property
    def ratio(self) -> float | None:
        return self.new_ms / self.old_ms if self.old_ms > 0 else None


@dataclass(frozen=True)
class PrefetchChange:
    layer: str
    old: dict | None  # {slot, copy_before, previous_forward} or None
    new: dict | None


@dataclass
class PlanDiff:
    settings: list[Change] = field(default_factory=list)  # backend, strategy, prefetch_step
    memory: list[MemoryDelta] = field(default_factory=list)  # every summary byte field (changed or not)
    to_host: dict[str, list[str]] = field(default_factory=dict)  # layer -> params moved GPU -> host
    to_gpu: dict[str, list[str]] = field(default_factory=dict)  # layer -> params moved host -> GPU
    prefetch: list[PrefetchChange] = field(default_factory=list)  # slot / trigger changes
    layers_added: list[str] = field(default_factory=list)
    layers_removed: list[str] = field(default_factory=list)
    other: list[Change] = field(default_factory=list)  # model, spec hash, counts, param specs, pool, notes
    param_names: dict[str, list[str]] = field(default_factory=dict)  # every param of each layer with moves
    time: list[TimeDelta] = field(default_factory=list)  # every workload (changed or not), when comparable
    hardware: str | None = None  # the profile both plans were predicted with
    time_note: str | None = None  # why the predicted times are not compared

    @property
    def changed(self) -> bool:
        return bool(self.settings or any(m.old != m.new for m in self.memory) or self.to_host or self.to_gpu
                    or self.prefetch or self.layers_added or self.layers_removed or self.other
                    or any(t.old_ms != t.new_ms for t in self.time))


def _workloads(preds: Predictions) -> list[tuple[str, int, float]]:
    return [(p.workload, p.tokens, p.weight) for p in preds.workloads]


def _time(d: PlanDiff, old: Predictions | None, new: Predictions | None) -> None:
    """Predicted step times side by side, or a note saying why they cannot be compared."""
    if old is None or new is None:
        which = "either plan" if old is None and new is None else ("the old plan" if old is None else "the new plan")
        if old is not new:
            d.time_note = f"predicted step times not compared: {which} has no predictions (re-plan it)"
        return
    if old.hardware != new.hardware:
        d.time_note = (f"predicted step times not compared: the old plan was predicted on '{old.hardware}', "
                       f"the new one on '{new.hardware}' (re-plan both with the same --hardware)")
        d.other.append(Change("predictions.hardware", old.hardware, new.hardware))
        return
    if _workloads(old) != _workloads(new):
        def show(p: Predictions) -> str:
            return ", ".join(f"{w}={t}" + (f":{x:g}" if x != 1 else "") for w, t, x in _workloads(p))
        d.time_note = (f"predicted step times not compared: the plans were predicted for different workloads "
                       f"(old: {show(old)}; new: {show(new)})")
        d.other.append(Change("predictions.workloads", show(old), show(new)))
        return
    d.hardware = old.hardware
    d.time = [TimeDelta(o.workload, o.tokens, o.step_ms, n.step_ms) for o, n in zip(old.workloads, new.workloads)]


def _prefetch(layer) -> dict | None:
    return None if layer.prefetch is None else layer.prefetch.model_dump()


def diff_plans(old: Plan, new: Plan) -> PlanDiff:
    d = PlanDiff()
    so, sn = old.summary, new.summary
    d.settings = [Change(f, getattr(so, f), getattr(sn, f)) for f in SETTINGS if getattr(so, f) != getattr(sn, f)]
    d.memory = [MemoryDelta(f, getattr(so, f), getattr(sn, f)) for f in BYTE_FIELDS]
    d.other = [Change(f, getattr(so, f), getattr(sn, f)) for f in OTHER_SUMMARY if getattr(so, f) != getattr(sn, f)]
    old_layers = {layer.name: layer for layer in old.layers}
    new_layers = {layer.name: layer for layer in new.layers}
    d.layers_removed = [name for name in old_layers if name not in new_layers]
    d.layers_added = [name for name in new_layers if name not in old_layers]
    for name, ln in new_layers.items():
        lo = old_layers.get(name)
        if lo is None:
            continue
        before, after = set(lo.offloaded), set(ln.offloaded)
        if after - before:
            d.to_host[name] = [p for p in ln.offloaded if p not in before]
        if before - after:
            d.to_gpu[name] = [p for p in lo.offloaded if p not in after]
        for was, now in (("prefetch", "uva"), ("uva", "prefetch")):  # offloaded in both, the backend changed
            switched = [p for p in ln.offloaded if p in before and (p in ln.uva) == (now == "uva") != (p in lo.uva)]
            if switched:
                d.other.append(Change(f"layers.{name} {_compress_params(switched, list(ln.params))}", was, now))
        if _prefetch(lo) != _prefetch(ln):
            d.prefetch.append(PrefetchChange(name, _prefetch(lo), _prefetch(ln)))
        if name in d.to_host or name in d.to_gpu:
            d.param_names[name] = list(ln.params)
        if lo.params != ln.params or lo.tied != ln.tied:
            d.other.append(Change(f"layers.{name}.params", "differ", "differ"))
    if [layer.name for layer in old.layers if layer.name in new_layers] != [
            layer.name for layer in new.layers if layer.name in old_layers]:
        d.other.append(Change("layer order", "differs", "differs"))
    if old.buffer_pool != new.buffer_pool:
        d.other.append(Change("buffer_pool", _pool_text(old), _pool_text(new)))
    _time(d, old.predictions, new.predictions)
    if not d.changed and old != new:
        d.other.append(Change("notes" if so.notes != sn.notes else "plan", "differ", "differ"))
    return d


def _pool_text(plan: Plan) -> str:
    pool = plan.buffer_pool
    if pool is None:
        return "none"
    return f"{pool.slots} slots, {len(pool.keys)} keys, {pool.bytes} bytes"


# ---------------------------------------------------------------------------
# Rendering.


def _moves(moves: dict[str, list[str]], param_names: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(compressed layer names, compressed params) lines; layers moving the same params are merged."""
    by_params: dict[tuple[str, ...], list[str]] = {}
    for layer, params in moves.items():
        by_params.setdefault(tuple(params), []).append(layer)
    lines = []
    for params, layers in by_params.items():
        # layers are merged only when they move the same params and hold the same params
        for names in _same_params(layers, param_names):
            text = _compress_params(list(params), param_names[names[0]])
            lines.append((", ".join(compress_names(names)), text))
    return lines


def _same_params(layers: list[str], param_names: dict[str, list[str]]) -> list[list[str]]:
    groups: dict[tuple[str, ...], list[str]] = {}
    for layer in layers:
        groups.setdefault(tuple(param_names[layer]), []).append(layer)
    return list(groups.values())


def _compress_params(params: list[str], all_params: list[str]) -> str:
    """``*`` for all of a layer's params; ``mlp.*`` when every param under ``mlp.`` is listed."""
    if set(params) == set(all_params):
        return "*"
    out, done = [], set()
    for p in params:
        if p in done:
            continue
        head = p.split(".")[0]
        under = [q for q in all_params if q.startswith(head + ".")]
        if len(under) > 1 and set(under) <= set(params):
            out.append(f"{head}.*")
            done.update(under)
        else:
            out.append(p)
            done.add(p)
    return ", ".join(out)


def _fmt_bytes(n: int | None) -> str:
    return "-" if n is None else f"{format_bytes(n)} ({n})"


def _fmt_delta(n: int) -> str:
    return "0" if n == 0 else ("+" if n > 0 else "-") + f"{format_bytes(abs(n))} ({n:+d})"


def render_diff(d: PlanDiff, fmt: str = "text") -> str:
    """Render as ``text``, ``markdown`` (a pull-request comment) or ``json``.

    Moved params collapse exactly: ``*`` is every param of the layer, ``mlp.*`` every param under ``mlp.``.
    """
    if fmt == "json":
        data = asdict(d) | {"changed": d.changed}
        del data["param_names"]
        for m, row in zip(d.memory, data["memory"]):
            row["delta"] = m.delta
        for t, row in zip(d.time, data["time"]):
            row["ratio"] = None if t.ratio is None else round(t.ratio, 4)
        return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    if fmt not in ("text", "markdown"):
        raise ValueError(f"unknown diff format '{fmt}': expected text, markdown or json")
    md = fmt == "markdown"
    out: list[str] = []
    if not d.changed:
        return "plans are equal\n"
    out.append("## Plan diff" if md else "plan diff")
    for c in d.settings:
        out.append(f"- {c.field}: {c.old} → {c.new}" if md else f"{c.field}: {c.old} -> {c.new}")
    out.append("")
    if md:
        out += ["| memory | old | new | delta |", "|---|---:|---:|---:|"]
        out += [f"| {m.field} | {_fmt_bytes(m.old)} | {_fmt_bytes(m.new)} | {_fmt_delta(m.delta)} |"
                for m in d.memory]
    else:
        out += [f"{m.field}: {_fmt_bytes(m.old)} -> {_fmt_bytes(m.new)} ({_fmt_delta(m.delta)})"
                for m in d.memory if m.delta or m.old != m.new]
    out += _time_lines(d, md)
    arrow = "→" if md else "->"
    for title, moves, where in (("GPU → host" if md else "GPU -> host", d.to_host, "host"),
                                ("host → GPU" if md else "host -> GPU", d.to_gpu, "GPU")):
        if moves:
            out += ["", f"### Moved {title}" if md else f"moved {title}:"]
            for layers, params in _moves(moves, d.param_names):
                out.append(f"- `{layers}`: `{params}` {arrow} {where}" if md else f"  {layers}: {params} {arrow} {where}")
    if d.prefetch:
        out += ["", "### Schedule changes" if md else "schedule changes:"]
        for p in d.prefetch:
            out.append(f"{'- ' if md else '  '}{p.layer}: {_sched(p.old)} {arrow} {_sched(p.new)}")
    for title, names in (("layers added", d.layers_added), ("layers removed", d.layers_removed)):
        if names:
            out += ["", f"{'### ' if md else ''}{title}{'' if md else ':'}", ("- " if md else "  ") + ", ".join(
                compress_names(names))]
    if d.other:
        out += ["", "### Other changes" if md else "other changes:"]
        out += [f"{'- ' if md else '  '}{c.field}: {c.old} {arrow} {c.new}" for c in d.other]
    return "\n".join(out) + "\n"


def _ratio(t: TimeDelta) -> str:
    return "-" if t.ratio is None else f"x{t.ratio:.2f}"


def _time_lines(d: PlanDiff, md: bool) -> list[str]:
    """Predicted step time per workload next to the memory change (or why it is not compared)."""
    if d.time_note:
        return ["", d.time_note]
    if not d.time:
        return []
    if md:
        return ["", f"| predicted step on {d.hardware} | tokens | old ms | new ms | ratio |",
                "|---|---:|---:|---:|---:|"] + [
            f"| {t.workload} | {t.tokens} | {t.old_ms:.3f} | {t.new_ms:.3f} | {_ratio(t)} |" for t in d.time]
    return [f"predicted step, {t.workload} ({t.tokens} token{'s' * (t.tokens != 1)}) on {d.hardware}: {t.old_ms:.3f} ms -> "
            f"{t.new_ms:.3f} ms ({_ratio(t)})" for t in d.time]


def _sched(p: dict | None) -> str:
    if p is None:
        return "none"
    prev = ", previous forward" if p["previous_forward"] else ""
    return f"slot {p['slot']}, copy before {p['copy_before']}{prev}"
