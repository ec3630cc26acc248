"""`planner check-plans [FILES...]`: are the committed plans still what their commands make?

The commands come from the plans manifest (planner/review/manifest.py). With no FILES every line is
checked; with FILES (the changed files pre-commit passes) the lines that name one of them as their
spec, plan or --hardware file, and every line when the manifest itself is among them. Each line is
checked as `planner plan ... --check PLAN` checks it: its words parsed by the plan command's option parser,
then the functions that command calls (planner/cli/plan_command.py; planner/review/lockfile.py decides the
verdict).

A given file that no line names is not checked: a spec without a committed plan, or any other file
pre-commit passes. Two such files are bad input: one that does not exist, and a plan (no line says
how it is made). A plan a line names that does not exist yet is out of date: it is to be made.

Exit code: the largest of the lines' (0 all up to date, 1 some out of date or not fitting their
budget, 2 bad input: a bad manifest line, a spec that does not load, a file above). Worded in
planner/review/check_plans_render.py; the command (read, check, say) is planner/cli/app.py's check-plans.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.errors import InputError, Problem
from schemas.hardware import is_profile_file, spec_hardware
from schemas.io import guess_kind, parse_text, read_text
from schemas.rank_plans import RANK_FILE

from planner.cli import exit_codes
from planner.cli.errors import explain
from planner.cli.plan_command import check_verdict, make_plan
from planner.review.manifest import Entry, path_key
from planner.cli.strict import parse_words

UP_TO_DATE, OUT_OF_DATE, MISSING, FAILED = "up to date", "out of date", "missing", "failed"


@dataclass(frozen=True)
class Outcome:
    """What checking one manifest line found."""

    entry: Entry
    status: str  # UP_TO_DATE, OUT_OF_DATE, MISSING or FAILED
    exit_code: int
    output: str = ""  # what `plan --check` printed: the verdict and the diff
    errors: str = ""  # what it said on stderr


@dataclass
class Selection:
    """The lines to check, and the given files they leave aside."""

    entries: list[Entry]
    not_checked: list[str] = field(default_factory=list)  # given files no line names (a spec, another file)
    problems: list[Problem] = field(default_factory=list)  # given files that are bad input


def select(entries: Sequence[Entry], files: Sequence[str], manifest: str) -> Selection:
    """The lines to check for the changed ``files`` (all of them when none are given)."""
    if not files:
        return Selection(list(entries))
    given = {key for f in files for key in _keys(f)}
    files_of = {e.line: [path_key(f) for f in e.files] for e in entries}
    named = {key for keys in files_of.values() for key in keys} | {path_key(manifest)}
    if given - named:  # a given file no line names itself may be a spec's `hardware:` profile
        for e in entries:
            profile = _spec_profile(e)
            if profile is not None:
                files_of[e.line].append(path_key(profile))
                named.add(path_key(profile))
    if path_key(manifest) in given:
        chosen = list(entries)
    else:
        chosen = [e for e in entries if any(key in given for key in files_of[e.line])]
    selection = Selection(chosen)
    for name in dict.fromkeys(files):
        if _keys(name) & named:
            continue
        problem = _unnamed_problem(name, manifest)
        if problem is None:
            selection.not_checked.append(name)
        else:
            selection.problems.append(problem)
    return selection


def _spec_profile(entry: Entry) -> str | None:
    """The profile file a line's spec names in its ``hardware:`` (as the plan command resolves it: from the
    spec's folder), when the line gives no --hardware; None otherwise, or when the spec does not read (its
    check says why)."""
    if entry.hardware is not None:
        return None
    try:
        data = parse_text(read_text(entry.spec), entry.spec)
    except InputError:
        return None
    value = data.get("hardware") if isinstance(data, dict) else None
    if not isinstance(value, str) or not is_profile_file(value):
        return None
    return spec_hardware(value, entry.spec)


def _keys(name: str) -> set[str]:
    """What a given file stands for: itself, and for a rank plan (``DIR/rank0.plan.yaml``) also its folder,
    which a tensor-parallel line names as its ``-o DIR``."""
    keys = {path_key(name)}
    if RANK_FILE.match(os.path.basename(name)):
        keys.add(path_key(os.path.dirname(name) or "."))
    return keys


def _unnamed_problem(name: str, manifest: str) -> Problem | None:
    """Why a file no line names is bad input (missing, or a plan), else None."""
    if not os.path.lexists(name):
        return Problem("no such file", name)
    if os.path.isdir(name):
        return Problem("is a directory, not a file", name)
    try:
        kind = guess_kind(parse_text(read_text(name), name))
    except InputError:
        return None  # not YAML or JSON, so no plan: nothing to check
    if kind != "plan":
        return None
    return Problem(f"a plan that no line of {manifest} makes: add the command that makes it there, "
                   f"`planner plan SPEC [options] -o {name}` (so its spec and options are known)", name)


def check(entry: Entry, plan_command: Any, diff_format: str, debug: bool = False) -> Outcome:
    """Check one line as `planner plan ... --check PLAN` does: the verdict and the exit code that command
    gives, its stdout (the verdict and the diff) and its stderr (why it failed) as text."""
    if not os.path.lexists(entry.plan):
        return Outcome(entry, MISSING, exit_codes.CHANGED)
    try:
        words = [entry.spec, *entry.options, "--check", entry.plan, "--diff-format", diff_format]
        ctx = parse_words(plan_command, words)
    except ValueError as usage:  # the manifest's reader parsed the line already: not expected
        return Outcome(entry, FAILED, exit_codes.BAD_INPUT, errors=f"error: {usage}\n")
    try:
        code, output = check_verdict(ctx, make_plan(ctx.params), entry.spec, entry.plan, diff_format)
        errors = ""
    except Exception as exc:  # noqa: BLE001 - said as the command says it, with its exit code
        (errors, code), output = explain(exc, debug), ""
    if code == exit_codes.OK:
        status = UP_TO_DATE
    elif code == exit_codes.CHANGED and not errors:
        status = OUT_OF_DATE
    else:
        status = FAILED  # bad input, no plan fits the budget, or a bug
    return Outcome(entry, status, code, output, errors)


def exit_code(outcomes: Sequence[Outcome], selection: Selection) -> int:
    """The largest exit code among the lines (bad input for a bad given file)."""
    codes = [o.exit_code for o in outcomes] + ([exit_codes.BAD_INPUT] if selection.problems else [])
    return max(codes, default=exit_codes.OK)
