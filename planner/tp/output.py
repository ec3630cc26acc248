"""Writing a rank set into a folder: ``rank{r}.plan.yaml`` for every rank, and only those.

The folder is created when missing. Every other rank plan file in the folder (a rank beyond the new world
size, or the other format's file of a rank) is removed: the folder's rank files are exactly the new set.
Other files in the folder are left alone. All of it is one ``write_set`` (planner/cli/output_set.py): every file
written and removed, or the folder exactly as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

from planner.cli.output_set import write_set
from schemas.errors import InputError
from schemas.io import dump_model
from schemas.plan import Plan
from schemas.rank_plans import FORMATS, rank_files, rank_plan_name

PLAN_SUFFIXES = (".yaml", ".yml", ".json")


def check_folder(path: str, world_size: int, asked: str | None = None) -> None:
    """``path`` can hold a rank set: a folder or nothing yet; InputError otherwise. ``asked``: what set the
    world size, for the message (``--tp N`` by default; ``parallel.tp: N (spec.yaml)`` from a spec)."""
    asked = asked or f"--tp {world_size}"
    if path in ("", "-"):
        given = "-o -" if path == "-" else "no -o"
        raise InputError(f"{asked} writes one plan per rank into a folder, and {given} gives none: "
                         "give -o FOLDER (the plans cannot all go to stdout)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"-o {path}: not a folder: {asked} writes rank0.plan.yaml ... "
                         f"rank{world_size - 1}.plan.yaml into a folder")
    if not os.path.exists(path) and path.lower().endswith(PLAN_SUFFIXES):
        raise InputError(f"-o {path}: looks like a file name, but {asked} writes one plan per rank "
                         "into a folder (give a folder name, e.g. plans/)")


def write_rank_plans(plans: list[Plan], folder: str | Path, fmt: str = "yaml") -> list[Path]:
    """Write ``plans`` (index = rank) into ``folder`` as the module docstring says; the paths written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown plan format {fmt!r}: expected yaml or json")
    check_folder(str(folder), len(plans))
    target = Path(folder)
    texts = [dump_model(plan, fmt) for plan in plans]
    written = [target / rank_plan_name(r, fmt) for r in range(len(plans))]
    made = _missing_folders(target)
    try:
        target.mkdir(parents=True, exist_ok=True)
        others = [path for paths in rank_files(target).values() for path in paths if path not in written]
        write_set(dict(zip(written, texts)), others)
    except BaseException:
        for path in made:  # the folders this call made, innermost first: the disk is as it was
            if path.is_dir():
                path.rmdir()
        raise
    return written


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, innermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing
