"""A tensor-parallel plan set: one plan file per rank in a folder, ``rank{r}.plan.yaml`` (or ``.json``).

The names and the checks of a set are defined here, in ``schemas/``, so that the planner that writes a
set and the runtime that reads one agree. A set is whole when its ranks are exactly ``0..world_size-1``,
every plan says that world size, and all were made from the same spec (``spec_sha256``) of the same model.
"""

from __future__ import annotations

import re
from pathlib import Path

from schemas.errors import InputError
from schemas.plan import Plan

RANK_FILE = re.compile(r"^rank(0|[1-9][0-9]*)\.plan\.(yaml|json)$")
FORMATS = ("yaml", "json")


def rank_plan_name(rank: int, fmt: str = "yaml") -> str:
    """The file name of rank ``rank``'s plan in a set folder."""
    return f"rank{rank}.plan.{fmt}"


def rank_files(folder: str | Path) -> dict[int, list[Path]]:
    """The rank plan files in ``folder`` by rank (a rank may have a YAML and a JSON file); others ignored."""
    found: dict[int, list[Path]] = {}
    for path in sorted(Path(folder).iterdir()):
        m = RANK_FILE.match(path.name)
        if m and path.is_file():
            found.setdefault(int(m.group(1)), []).append(path)
    return found


def set_files(folder: str | Path) -> list[Path]:
    """The files of the whole set in ``folder``, by rank; InputError when there is none, a rank has two files
    or a rank is missing."""
    found = one_file_a_rank(folder)
    missing = [r for r in range(max(found) + 1) if r not in found]
    if missing:
        raise InputError(f"{folder}: the rank plans are {_ranks(found)}: rank {missing[0]} is missing")
    return [found[r] for r in sorted(found)]


def one_file_a_rank(folder: str | Path, make: str = "planner plan SPEC --tp N -o FOLDER") -> dict[int, Path]:
    """The rank plan file of each rank in ``folder`` (ranks may be missing); InputError when there is none or
    a rank has two files. ``make``: the command the message suggests for making them."""
    found = rank_files(folder)
    other = next((p for p in sorted(Path(folder).iterdir()) if RANK_FILE.match(p.name) and not p.is_file()), None)
    if other is not None:  # read as a set, it would be skipped: say so
        raise InputError(f"{other}: named as a rank plan, but it is not a file")
    if not found:
        raise InputError(f"{folder}: no rank plans (rank0.plan.yaml, rank1.plan.yaml, ...) in this folder; "
                         f"make them with `{make}`")
    twice = [paths for paths in found.values() if len(paths) > 1]
    if twice:
        raise InputError(f"{folder}: rank {RANK_FILE.match(twice[0][0].name).group(1)} has two plans "  # type: ignore[union-attr]
                         f"({', '.join(p.name for p in twice[0])}); keep one")
    return {r: paths[0] for r, paths in found.items()}


def _ranks(found: dict[int, Path]) -> str:
    return ", ".join(path.name for _, path in sorted(found.items()))


def set_problems(plans: list[Plan], names: list[str]) -> list[str]:
    """What makes ``plans`` (rank order, read from ``names``) not one rank set: each problem a sentence."""
    out = []
    first = plans[0].summary
    for r, (plan, name) in enumerate(zip(plans, names)):
        s = plan.summary
        if s.world_size is None:
            out.append(f"{name}: not a rank plan (its summary has no rank and world_size)")
            continue
        if s.rank != r:
            out.append(f"{name}: summary.rank is {s.rank}, but it is in rank {r}'s place")
        if s.world_size != len(plans):
            out.append(f"{name}: summary.world_size is {s.world_size}, but the set has {len(plans)} rank plans")
        if r and (s.model, s.spec_sha256) != (first.model, first.spec_sha256):
            out.append(f"{name}: made from another spec than {names[0]} (model {s.model}, spec_sha256 "
                       f"{s.spec_sha256[:12]}... vs {first.model}, {first.spec_sha256[:12]}...)")
        elif r:
            out += _other_shapes(plans[0], plan, names[0], name)
    return out


def _other_shapes(first: Plan, plan: Plan, first_name: str, name: str) -> list[str]:
    """Where ``plan``'s layers and params differ from ``first``'s: the ranks of one split hold parts of one
    shape (a split dimension divides evenly), so every rank plan has the same layers, params and shapes."""
    if [layer.name for layer in plan.layers] != [layer.name for layer in first.layers]:
        return [f"{name}: layers: not the layers of {first_name} (the ranks of one set have the same layers)"]
    for i, (mine, theirs) in enumerate(zip(plan.layers, first.layers)):
        if mine.params.keys() != theirs.params.keys():
            return [f"{name}: layers[{i}].params: not the params of {first_name}'s layer '{theirs.name}'"]
        for rel, p in mine.params.items():
            q = theirs.params[rel]
            if (p.shape, p.dtype, p.shard) != (q.shape, q.dtype, q.shard):
                return [f"{name}: layers[{i}].params['{rel}']: shape {p.shape} {p.dtype} (shard {p.shard}), but "
                        f"{first_name} has shape {q.shape} {q.dtype} (shard {q.shard}): the ranks of one set hold "
                        "parts of one shape"]
    return []


def check_set(plans: list[Plan], names: list[str]) -> None:
    """InputError listing every problem when ``plans`` are not one whole rank set."""
    problems = set_problems(plans, names)
    if problems:
        raise InputError(problems)


def load_set(folder: str | Path) -> list[Plan]:
    """The plans of the rank set in ``folder``, by rank; InputError when a file or the set is bad."""
    from schemas.io import load_plan

    files = set_files(folder)
    plans = [load_plan(path) for path in files]
    sizes = {plan.summary.world_size for plan in plans}
    if len(sizes) == 1 and (size := sizes.pop()) is not None and size > len(plans):
        missing = ", ".join(rank_plan_name(r, files[0].suffix[1:]) for r in range(len(plans), size))
        raise InputError(f"{folder}: the plans are for {size} ranks but only {_names(files)} "
                         f"{'is' if len(files) == 1 else 'are'} here: {missing} missing")
    check_set(plans, [str(path) for path in files])
    return plans


def check_in_its_set(path: str | Path, plan: Plan) -> None:
    """A rank plan named as one of a set (``DIR/rank{r}.plan.yaml``) is checked with its set: InputError when
    the set's plans contradict each other (a world size, a rank, a spec, shapes). A rank plan under another
    name stands alone."""
    path = Path(path)
    if plan.summary.world_size is not None and RANK_FILE.match(path.name) and path.is_file():
        load_set(path.parent)


def _names(files: list[Path]) -> str:
    return ", ".join(path.name for path in files)
