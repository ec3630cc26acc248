"""`planner plan --tp N`: what the command line adds to tensor-parallel planning (planner/tp/ranks.py): the world
size from the flag or the spec, the checks of the request, writing the set and saying what each rank costs.
The tensor-parallel machinery is imported only when a set is planned: `planner plan` for one GPU never loads it."""

from __future__ import annotations

import sys

from schemas.plan import Plan
from schemas.spec import SpecFile


def world_size(flag: int | None, spec: SpecFile) -> int:
    """--tp N, else the spec's parallel.tp, else 1."""
    if flag is not None:
        return flag
    return spec.parallel.tp if spec.parallel is not None else 1


def asked(flag: int | None, world: int, spec_name: str) -> str:
    """What set the world size, as the user wrote it: ``--tp N``, or the spec's ``parallel.tp``."""
    return f"--tp {world}" if flag is not None else f"parallel.tp: {world} ({spec_name})"


def check_request(world: int, output: str | None, check: str | None, asked: str | None = None) -> None:
    """Refuse, before planning, what a rank set cannot do: no folder to write to (unless --check DIR)."""
    if check is None:
        from planner.tp.output import check_folder

        check_folder(output or "", world, asked)


def write_set(plans: list[Plan], output: str, fmt: str) -> None:
    """Write the set into ``output`` and say, on stdout, what each rank holds and costs."""
    from planner.tp import notes as tp_notes
    from planner.tp.output import write_rank_plans
    from planner.tp.ranks import slowest_rank

    written = write_rank_plans(plans, output, fmt)
    lines = [f"wrote {len(written)} rank plans to {output}: {', '.join(p.name for p in written)}"]
    lines += tp_notes.set_lines(plans, slowest_rank(plans))
    sys.stdout.write("\n".join(lines) + "\n")
