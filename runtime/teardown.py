"""Undoing an apply: the steps ``remove()`` and a failed ``apply`` share.

Every step runs even when an earlier one fails; a step that failed stays pending, so a
second ``remove()`` retries exactly what is left and a step never runs twice. Errors are
raised only once every step has had its turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtime.errors import ApplyError

log = logging.getLogger("runtime")

# a step returns the problems it could not fix (empty when done) or raises
Step = tuple[str, Callable[[], list[str] | None]]


class RemoveError(ApplyError):
    """``remove()`` could not restore everything. Everything else was restored; the handle is
    no longer active; calling ``remove()`` again retries what is listed."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        body = "\n".join(f"  - {p}" for p in problems[:20])
        more = f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"remove() restored everything else but {len(problems)} step"
                         f"{'s' if len(problems) != 1 else ''} failed; call remove() again to retry:\n{body}{more}")


def run_steps(steps: list[Step]) -> tuple[list[Step], list[str]]:
    """Run every step; return the steps still pending and what went wrong."""
    pending: list[Step] = []
    problems: list[str] = []
    for name, step in steps:
        try:
            left = step() or []
        except Exception as exc:  # noqa: BLE001 - collected and re-raised after the other steps
            left = [f"{type(exc).__name__}: {exc}"]
            log.debug("teardown step %s failed", name, exc_info=True)
        if left:
            pending.append((name, step))
            problems += [f"{name}: {p}" for p in left]
    return pending, problems
