"""`planner plan SPEC --tp N --check DIR`: is the committed rank set in DIR what the planner makes now?

Each rank's committed plan is checked as `--check PLAN` checks one plan (planner/review/lockfile.py), against the
rank plan made now; the set is up to date when every rank is and DIR holds exactly N rank plans. Every
verdict's refresh command writes the whole set again: the user's command line with ``-o DIR``.
Worded in planner/review/lockfile_render.py.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import InputError
from schemas.plan import Plan
from schemas.rank_plans import one_file_a_rank

from planner.cli import exit_codes
from planner.review.lockfile import SAME, Check, check_plan


@dataclass(frozen=True)
class SetCheck:
    """The verdicts on a committed rank set, by rank, and the ranks only one side has."""

    folder: str
    refresh: str
    ranks: list[Check]  # ranks both the folder and the command have, in order
    committed_ranks: int
    made_ranks: int
    missing: tuple[int, ...] = ()  # ranks the command makes that the folder lacks

    @property
    def up_to_date(self) -> bool:
        return (self.committed_ranks == self.made_ranks and not self.missing
                and all(c.status == SAME for c in self.ranks))

    @property
    def exit_code(self) -> int:
        return exit_codes.OK if self.up_to_date else exit_codes.CHANGED


def check_rank_set(fresh: list[Plan], spec: str, folder: str, options: Sequence[str]) -> SetCheck:
    """The verdict on the rank set committed in ``folder`` against ``fresh`` (index = rank), made by
    ``planner plan SPEC`` with ``options`` (the words as given, no --check or -o)."""
    if folder == "-" or not Path(folder).is_dir():
        raise InputError(f"--check {folder}: with --tp {len(fresh)} this is the folder of the committed rank plans "
                         f"(rank0.plan.yaml ...), and it is {'stdin' if folder == '-' else 'not a folder'}")
    refresh = "planner plan " + shlex.join([spec, *options, "-o", folder])
    found = one_file_a_rank(folder, make=refresh)
    ranks = [dataclasses.replace(check_plan(plan, spec, str(found[r]), options), refresh=refresh)
             for r, plan in enumerate(fresh) if r in found]
    missing = tuple(r for r in range(len(fresh)) if r not in found)
    return SetCheck(folder, refresh, ranks, len(found), len(fresh), missing)
