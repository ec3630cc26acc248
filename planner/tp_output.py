"""Writing a rank set into a folder: ``rank{r}.plan.yaml`` for every rank, and only those.

The folder is created when missing. Every plan is written to a temporary file first; only when all are
written are they renamed into place, so a failure leaves the folder's old set as it was. Then every other
rank plan file in the folder (a rank beyond the new world size, or the other format's file of a rank) is
removed: the folder's rank files are exactly the new set. Other files in the folder are left alone.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

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
    target.mkdir(parents=True, exist_ok=True)
    texts = [dump_model(plan, fmt) for plan in plans]
    staged: list[str] = []
    try:
        for r, text in enumerate(texts):
            fd, tmp = tempfile.mkstemp(prefix=f".rank{r}.", suffix=".tmp", dir=target)
            staged.append(tmp)
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
    except BaseException:
        for tmp in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    written = [target / rank_plan_name(r, fmt) for r in range(len(plans))]
    for tmp, path in zip(staged, written):
        os.replace(tmp, path)
    keep = set(written)
    for paths in rank_files(target).values():
        for path in paths:
            if path not in keep:
                path.unlink()
    return written


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
