"""`planner show DIR` and `planner diff OLD_DIR NEW_DIR` for rank sets (planner/tp/ranks.py writes them): a table
of the ranks with the slowest rank's predicted step, and a diff rank by rank."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from schemas.plan import Plan
from schemas.prediction import Predictions
from schemas.sizes import format_bytes

from planner.tp import notes as tp_notes
from planner.review.diff import PlanDiff, diff_plans
from planner.review.diff_render import render_diff
from planner.tp.ranks import slowest_of

RANK_FIELDS = ("peak_gpu_bytes", "resident_bytes", "offloaded_bytes", "buffer_bytes", "pinned_host_bytes")


def rank_rows(plans: list[Plan], predictions: list[Predictions | None]) -> list[dict[str, Any]]:
    rows = []
    for plan, preds in zip(plans, predictions):
        s = plan.summary
        row: dict[str, Any] = {"rank": s.rank, "offloaded_layers": s.offloaded_layers}
        row |= {f: getattr(s, f) for f in RANK_FIELDS}
        row["step_ms"] = None if preds is None else preds.weighted_step_ms
        rows.append(row)
    return rows


def _slowest(rows: list[dict[str, Any]]) -> int | None:
    return slowest_of([r["step_ms"] for r in rows])  # rows are in rank order (load_set)


def render_set_json(plans: list[Plan], predictions: list[Predictions | None]) -> str:
    s = plans[0].summary
    rows = rank_rows(plans, predictions)
    slowest = _slowest(rows)
    return json.dumps({"model": s.model, "world_size": s.world_size, "spec_sha256": s.spec_sha256, "ranks": rows,
                       "slowest_rank": slowest,
                       "step_ms": None if slowest is None else rows[slowest]["step_ms"]}, indent=2) + "\n"


def render_set_table(plans: list[Plan], console: Any, predictions: list[Predictions | None]) -> None:
    """The ranks side by side, the notes they share, and the rank that sets the step."""
    from rich.table import Table

    s = plans[0].summary
    console.print(f"[bold]{s.model}[/bold]: {s.world_size} rank plans (tensor parallel), backend "
                  f"[cyan]{s.backend}[/cyan], strategy {s.strategy}", highlight=False, markup=True)
    rows = rank_rows(plans, predictions)
    table = Table(header_style="bold")
    for title in ("rank", "peak GPU", "resident", "offloaded", "buffers", "pinned host", "offloaded layers",
                  "step ms"):
        table.add_column(title, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(str(row["rank"]), *(format_bytes(row[f]) for f in RANK_FIELDS), str(row["offloaded_layers"]),
                      "-" if row["step_ms"] is None else f"{row['step_ms']:.3f}")
    console.print(table)
    shared = [n for n in s.notes if all(n in p.summary.notes for p in plans[1:])]
    for note in shared:
        console.print(f"note: {note}", highlight=False, markup=False)
    slowest = _slowest(rows)
    if slowest is not None:
        console.print(tp_notes.slowest_line(slowest, rows[slowest]["step_ms"]), highlight=False, markup=False)


@dataclass
class SetDiff:
    old_world: int
    new_world: int
    ranks: dict[int, PlanDiff]  # the ranks both sets have

    @property
    def changed(self) -> bool:
        return self.old_world != self.new_world or any(d.changed for d in self.ranks.values())


def diff_sets(old: list[Plan], new: list[Plan]) -> SetDiff:
    return SetDiff(len(old), len(new), {r: diff_plans(old[r], new[r]) for r in range(min(len(old), len(new)))})


def render_set_diff(d: SetDiff, fmt: str) -> str:
    if fmt == "json":
        body = {"world_size": {"old": d.old_world, "new": d.new_world}, "changed": d.changed,
                "ranks": {str(r): json.loads(render_diff(rd, "json")) for r, rd in d.ranks.items()}}
        return json.dumps(body, indent=2) + "\n"
    md = fmt == "markdown"
    out = []
    if d.old_world != d.new_world:
        out.append(tp_notes.world_change(d.old_world, d.new_world, md))
    for r, rd in d.ranks.items():
        head = f"## Rank {r}" if md else f"rank {r}:"
        text = render_diff(rd, fmt).rstrip("\n")
        out.append(f"{head}\n\n{text}" if md else f"{head} {text}" if not rd.changed else f"{head}\n{text}")
    return "\n\n".join(out) + "\n"


def show_set(folder: str, fmt: str, chart: str | None, hardware: str | None, workload: str | None,
             console: Any) -> None:
    """`planner show DIR`: the rank set's table (or JSON), predictions again on ``hardware``/``workload``."""
    import sys

    from schemas.errors import InputError
    from schemas.rank_plans import load_set

    from planner.cost.predicted import chosen_predictions

    if chart is not None:
        raise InputError(f"--chart draws one plan, and {folder} is a folder of rank plans: give one rank's file, "
                         f"e.g. {folder.rstrip('/')}/rank0.plan.yaml")
    plans = load_set(folder)
    predictions: list[Predictions | None] = [chosen_predictions(p, hardware, workload) for p in plans]
    if fmt == "json":
        sys.stdout.write(render_set_json(plans, predictions))
    else:
        render_set_table(plans, console(), predictions)


def diff_set_folders(old: str, new: str, fmt: str) -> int:
    """`planner diff OLD_DIR NEW_DIR`: the diff on stdout; 1 when the sets differ, else 0."""
    import os
    import sys

    from schemas.errors import InputError
    from schemas.rank_plans import load_set

    from planner.cli.exit_codes import CHANGED, OK

    if not (os.path.isdir(old) and os.path.isdir(new)):
        folder, other = (old, new) if os.path.isdir(old) else (new, old)
        raise InputError(f"{folder} is a folder of rank plans but {other} is not: compare two folders, or two "
                         f"plan files (e.g. {folder.rstrip('/')}/rank0.plan.yaml)")
    d = diff_sets(load_set(old), load_set(new))
    sys.stdout.write(render_set_diff(d, fmt))
    return CHANGED if d.changed else OK
