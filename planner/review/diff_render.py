"""The words of a plan diff (planner/review/diff.py decides it): text for a terminal, markdown for a
pull-request comment, json for tools. Text and markdown give the same facts in the same order:
the churn line, the model, memory and predicted step time, params moved, settings, the schedule
(a count, the first few, "and N more"), the rest."""

from __future__ import annotations

import json
from dataclasses import asdict

from schemas.sizes import format_bytes

from planner.review.diff import Change, Churn, ModelDiff, ParamGroup, PlanDiff, PrefetchChange, TimeDelta
from planner.words.names import compress_names

SCHEDULE_SHOWN = 5  # schedule changes listed before "and N more"
NO_CHANGES = "no changes"
FORMATS = ("text", "markdown", "json")


def render_diff(d: PlanDiff, fmt: str = "text") -> str:
    """Render as ``text``, ``markdown`` (a pull-request comment) or ``json``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown diff format '{fmt}': expected text, markdown or json")
    if fmt == "json":
        return json.dumps(_json(d), indent=2, default=str) + "\n"
    if not d.changed:
        return NO_CHANGES + "\n"
    md = fmt == "markdown"
    out = ["## Plan diff", "", f"**{_churn(d.churn, md)}**"] if md else [f"plan diff: {_churn(d.churn, md)}"]
    for title, lines in (("model", _model(d.model, md)), ("memory and predicted step time", _memory(d, md)),
                         _moves_section(d, md), ("settings", _changes(d.settings, md)), _schedule(d.schedule, md),
                         ("other", _changes(d.other, md))):
        if lines:
            out += ["", f"### {title[0].upper()}{title[1:]}" if md else f"{title}:"]
            out += lines if md else ["  " + line for line in lines]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# Pieces shared by text and markdown.


def _arrow(md: bool) -> str:
    return "→" if md else "->"


def _code(s: str, md: bool) -> str:
    return f"`{s}`" if md else s


def _word(value: object) -> str:
    """A value in words: ``none`` rather than ``None``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _fmt_bytes(n: int | None) -> str:
    return "none" if n is None else f"{format_bytes(n)} ({n})"


def _fmt_delta(n: int) -> str:
    return "0" if n == 0 else ("+" if n > 0 else "-") + f"{format_bytes(abs(n))} ({n:+d})"


def _signed(n: int) -> str:
    return "0 B" if n == 0 else ("+" if n > 0 else "") + format_bytes(n)


def _churn(c: Churn, md: bool) -> str:
    """Both directions with their bytes and the net change, so churn shows at once."""
    a = _arrow(md)
    if not c.moved:
        return "no params moved"
    text = (f"moved {c.to_host} params GPU {a} host ({format_bytes(c.to_host_bytes)}), {c.to_gpu} host {a} GPU "
            f"({format_bytes(c.to_gpu_bytes)}), net {_signed(c.net_gpu_bytes)} on the GPU")
    if c.between_host:
        text += f"; {c.between_host} between prefetch and uva ({format_bytes(c.between_host_bytes)})"
    return text


def _changes(changes: list[Change], md: bool) -> list[str]:
    a, dash = _arrow(md), "- " if md else ""
    return [f"{dash}{c.field}: {_word(c.old)} {a} {_word(c.new)}" for c in changes]


def _names(names: list[str], md: bool) -> str:
    return _code(", ".join(compress_names(names)), md)


def _renamed(pairs: list[tuple[str, str]], md: bool) -> str:
    """``old.{0..3} -> new.{0..3}`` when each side compresses to one name, else pair by pair."""
    a = _arrow(md)
    olds, news = compress_names(o for o, _ in pairs), compress_names(n for _, n in pairs)
    if len(olds) == len(news) == 1:
        return f"{_code(olds[0], md)} {a} {_code(news[0], md)}"
    return ", ".join(f"{_code(o, md)} {a} {_code(n, md)}" for o, n in pairs)


def _param_change(g: ParamGroup, md: bool) -> str:
    a, dash = _arrow(md), "- " if md else ""
    head = f"{dash}{_code(g.layers_text, md)}: {_code(g.params_text, md)}"
    if g.what == "param":
        return f"{head} {'added' if g.old == 'none' else 'removed'} ({g.new if g.old == 'none' else g.old})"
    return f"{head} {g.what} {g.old} {a} {g.new}"


def _model(m: ModelDiff, md: bool) -> list[str]:
    dash = "- " if md else ""
    out = [f"{dash}{c.field}: {_word(c.old)[:12]} {_arrow(md)} {_word(c.new)[:12]}" if c.field == "spec_sha256"
           else f"{dash}{c.field}: {_word(c.old)} {_arrow(md)} {_word(c.new)}" for c in m.changes]
    for title, names in (("layers added", m.layers_added), ("layers removed", m.layers_removed)):
        if names:
            out.append(f"{dash}{title}: {_names(names, md)}")
    if m.layers_renamed:
        out.append(f"{dash}layers renamed: {_renamed(m.layers_renamed, md)}")
    if m.layer_order_changed:
        out.append(f"{dash}layer order changed")
    return out + [_param_change(g, md) for g in m.params]


def _ratio(t: TimeDelta) -> str:
    return "-" if t.ratio is None else f"x{t.ratio:.2f}"


def _memory(d: PlanDiff, md: bool) -> list[str]:
    """The memory that changed, with the predicted step time per workload next to it (or why it is
    not compared)."""
    rows = [m for m in d.memory if m.old != m.new]
    out: list[str] = []
    if md and rows:
        out += ["| memory | old | new | delta |", "|---|---:|---:|---:|"]
        out += [f"| {m.field} | {_fmt_bytes(m.old)} | {_fmt_bytes(m.new)} | {_fmt_delta(m.delta)} |" for m in rows]
    elif rows:
        out += [f"{m.field}: {_fmt_bytes(m.old)} -> {_fmt_bytes(m.new)} ({_fmt_delta(m.delta)})" for m in rows]
    if d.time_note:
        return out + (["", d.time_note] if md and out else [d.time_note])
    if not d.time or not (rows or any(t.old_ms != t.new_ms for t in d.time)):
        return out  # the step time is shown next to a change, not alone
    if md:
        return out + ([""] if out else []) + [
            f"| predicted step on {d.hardware} | tokens | old ms | new ms | ratio |", "|---|---:|---:|---:|---:|"] + [
            f"| {t.workload} | {t.tokens} | {t.old_ms:.3f} | {t.new_ms:.3f} | {_ratio(t)} |" for t in d.time]
    return out + [f"predicted step, {t.workload} ({t.tokens} token{'s' * (t.tokens != 1)}) on {d.hardware}: "
                  f"{t.old_ms:.3f} ms -> {t.new_ms:.3f} ms ({_ratio(t)})" for t in d.time]


def _moves_section(d: PlanDiff, md: bool) -> tuple[str, list[str]]:
    params = sum(len(g.params) * len(g.layers) for g in d.moves)
    layers = len({name for g in d.moves for name in g.layers})
    title = f"moved ({params} params in {layers} layers)" if d.moves else "moved"
    out: list[str] = []
    if md and d.moves:
        out += ["| layers | params | from | to | bytes |", "|---|---|---|---|---:|"]
        out += [f"| `{g.layers_text}` | `{g.params_text}` | {g.old} | {g.new} | {format_bytes(g.bytes)} |"
                for g in d.moves]
    else:
        out += [f"{g.layers_text}: {g.params_text} {g.old} -> {g.new}, {format_bytes(g.bytes)}" for g in d.moves]
    if d.offloaded_layers:
        out += ([""] if md and out else []) + _changes([d.offloaded_layers], md)
    return title, out


def _slot(p: dict | None) -> str:
    if p is None:
        return "none"
    prev = ", previous forward" if p["previous_forward"] else ""
    where = "spanning the slots" if p.get("span") else f"slot {p['slot']}"
    return f"{where}, copy before {p['copy_before']}{prev}"


def schedule_counts(changes: list[PrefetchChange]) -> dict[str, int]:
    return {kind: sum(c.kind == kind for c in changes) for kind in ("new", "dropped", "changed")}


def _schedule(changes: list[PrefetchChange], md: bool) -> tuple[str, list[str]]:
    counts = schedule_counts(changes)
    title = f"schedule ({len(changes)} layer{'s' * (len(changes) != 1)} changed: " + ", ".join(
        f"{n} {kind}" for kind, n in counts.items() if n) + ")"
    a, dash = _arrow(md), "- " if md else ""
    out = [f"{dash}{_code(c.layer, md)}: {_slot(c.old)} {a} {_slot(c.new)}" for c in changes[:SCHEDULE_SHOWN]]
    if len(changes) > SCHEDULE_SHOWN:
        out.append(f"{dash}and {len(changes) - SCHEDULE_SHOWN} more")
    return title, out


def _json(d: PlanDiff) -> dict:
    data = asdict(d)
    data["changed"] = d.changed
    for m, row in zip(d.memory, data["memory"]):
        row["delta"] = m.delta
    for t, row in zip(d.time, data["time"]):
        row["ratio"] = None if t.ratio is None else round(t.ratio, 4)
    data["schedule"] = {"count": len(d.schedule), **schedule_counts(d.schedule),
                        "changes": [{"kind": c.kind} | row for c, row in zip(d.schedule, data["schedule"])]}
    order = ("changed", "churn", "model", "memory", "hardware", "time", "time_note", "moves", "offloaded_layers",
             "settings", "schedule", "other")
    return {k: data[k] for k in order}
