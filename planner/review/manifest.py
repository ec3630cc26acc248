"""The plans manifest (``planner-plans.sh``): the command that makes each committed plan.

One ``planner plan SPEC [options] -o PLAN`` a line, ``#`` comments and blank lines, a long command
continued with a trailing backslash. That is the line `planner plan --check` prints as the refresh
command, and the file is a shell script as well: ``sh planner-plans.sh`` (from the manifest's folder)
makes every plan again. `planner check-plans` reads it to know which plan belongs to which spec and
options. Paths in it are relative to the manifest's folder.

So that sh and this reader see the same words, each line follows one strict grammar
(planner/review/manifest_lines.py): plain words and quotes, LF line ends, a backslash only as the last character
of a continued line; anything sh would read otherwise is refused with its line. Every line is parsed by the plan command's own option parser, so a misspelled or
out-of-range option is found here, with its line, before anything is checked.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.cli.strict import parse_words
from planner.review.manifest_lines import command_lines
from schemas.errors import InputError, Problem
from schemas.input_file import read_input

MANIFEST = "planner-plans.sh"  # the default, in the current folder (a repository's root)
ONE_A_LINE = "one `planner plan SPEC [options] -o PLAN` command a line"
LEAVE_OUT = ("check", "diff_format")  # options of `planner plan` that make no plan


@dataclass(frozen=True)
class Entry:
    """One line of the manifest: the plan command, with paths as seen from the current folder."""

    line: int  # where it starts in the manifest
    spec: str
    plan: str
    options: tuple[str, ...]  # the words after SPEC, without -o PLAN (a --hardware FILE made relative too)
    hardware: str | None  # the --hardware value: a bundled name, or a file as seen from here

    @property
    def files(self) -> tuple[str, ...]:
        """The files whose change can change this plan, or which the plan is."""
        return (self.spec, self.plan) + ((self.hardware,) if self.hardware else ())

    @property
    def command(self) -> str:
        """The line as a command to run from the current folder."""
        return "planner plan " + shlex.join([self.spec, *self.options, "-o", self.plan])


def read_manifest(path: str, plan_command: Any) -> list[Entry]:
    """The entries of the manifest at ``path``, or one InputError with every bad line.
    ``plan_command`` is the click command of `planner plan`, which parses each line's options."""
    text = _read(path)
    folder = os.path.dirname(path)
    entries: list[Entry] = []
    commands, bad_lines = command_lines(text)
    problems: list[Problem] = [Problem(why, path, number) for number, why in bad_lines]
    for number, words in commands:
        try:
            entries.append(_entry(number, words, folder, plan_command))
        except ValueError as err:
            problems.append(Problem(str(err), path, number))
    problems.sort(key=lambda p: p.line or 0)
    seen: dict[str, int] = {}
    for entry in entries:
        key = path_key(entry.plan)
        if key in seen:
            problems.append(Problem(f"-o {entry.plan}: line {seen[key]} makes this plan already; "
                                    "each plan has one command", path, entry.line))
        seen.setdefault(key, entry.line)
    if problems:
        raise InputError(problems)
    if not entries:
        raise InputError(Problem(f"no plan command in it; write {ONE_A_LINE} (the refresh command "
                                 "`planner plan --check` prints)", path))
    return entries


def _read(path: str) -> str:
    """The manifest's text, or InputError saying plainly why it cannot be read."""
    if not os.path.lexists(path):
        raise InputError(f"{path}: no such file; the plans manifest has the command that makes each committed "
                         f"plan, {ONE_A_LINE} (README: Plans in review)")
    try:
        return read_input(path).decode("utf-8")  # a BOM is kept: manifest_lines refuses it, as sh would
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not a text file (byte {err.start} is not UTF-8); expected {ONE_A_LINE}") from None


def _entry(number: int, words: Sequence[str], folder: str, plan_command: Any) -> Entry:
    """One plan command's words as an Entry, or ValueError saying what is wrong with them."""
    if words[:2] != ["planner", "plan"]:
        raise ValueError(f"'{' '.join(words[:2])}': expected {ONE_A_LINE}")
    ctx = parse_words(plan_command, words[2:])
    params = ctx.params
    for name in LEAVE_OUT:
        if params.get(name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag}: check-plans adds --check itself; a line has the command that makes "
                             "the plan, with -o PLAN")
    spec, plan, hardware = params["spec"], params.get("output"), params.get("hardware")
    if plan is None or plan == "-":
        raise ValueError("no -o PLAN: each line writes the committed plan it makes to a file (-o PLAN)")
    if spec == "-":
        raise ValueError("SPEC is '-' (stdin): a committed plan is made from a spec file")
    from planner.cli.command_line import words_given

    options = words_given(ctx, leave_out=("spec", "output", "hardware"))
    if hardware is not None:
        if os.path.isfile(_at(folder, hardware)):
            hardware = _at(folder, hardware)
        options += ["--hardware", hardware]
    return Entry(number, _at(folder, spec), _at(folder, plan), tuple(options), hardware)


def path_key(path: str) -> str:
    """A path's identity for matching, however it is spelled (./a.yaml, a.yaml, /repo/a.yaml, a link)."""
    return os.path.normcase(os.path.realpath(path))


def _at(folder: str, path: str) -> str:
    """``path`` (relative to the manifest's folder) as seen from the current folder."""
    return path if not folder or os.path.isabs(path) else os.path.normpath(os.path.join(folder, path))
