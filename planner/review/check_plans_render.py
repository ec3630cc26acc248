"""The words of `planner check-plans` (planner/review/check_plans.py decides): each line's `plan --check`
output as it printed it, a failed line followed by the manifest line it came from, then one closing
sentence with the counts and what to run. The same words serve text and markdown."""

from __future__ import annotations

import os
from collections.abc import Sequence

from planner.review.check_plans import FAILED, MISSING, OUT_OF_DATE, UP_TO_DATE, Outcome, Selection


def outcome_text(outcome: Outcome, manifest: str, md: bool = False) -> tuple[str, str]:
    """(stdout, stderr) for one checked line: what its check printed, a missing plan said here."""
    entry = outcome.entry
    if outcome.status == MISSING:
        said = f"{entry.plan} does not exist; make it with: {entry.command}"
        if md:
            said = f"**`{entry.plan}` does not exist.** Make it with:\n\n```sh\n{entry.command}\n```"
        return said + "\n", ""
    errors = outcome.errors
    if outcome.status == FAILED:
        errors += f"hint: {manifest} line {entry.line}: {entry.command}\n"
    output = outcome.output
    if outcome.status == OUT_OF_DATE:
        output += "\n"  # a blank line before the next plan's diff
    return output, errors


def summary(outcomes: Sequence[Outcome], selection: Selection, manifest: str) -> str:
    """The closing sentence (and the given files that were not checked)."""
    statuses = (UP_TO_DATE, OUT_OF_DATE, MISSING, FAILED)
    counts = {status: sum(o.status == status for o in outcomes) for status in statuses}
    plans = f"{len(outcomes)} plan" + ("" if len(outcomes) == 1 else "s")
    parts = [f"{n} {status}" for status, n in counts.items() if n]
    lines = [f"check-plans: {plans} checked" + (": " + ", ".join(parts) if parts else "")]
    if counts[OUT_OF_DATE] or counts[MISSING]:
        folder, name = os.path.split(manifest)
        where = f"cd {folder} && " if folder else ""
        lines.append(f"refresh: the command given above, or every plan at once: {where}sh {name}")
    if selection.not_checked:
        lines.append(f"not checked, no line of {manifest} names them: " + ", ".join(selection.not_checked))
    return "\n".join(lines) + "\n"
