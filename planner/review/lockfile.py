"""`planner plan SPEC ... --check PLAN`: is the committed PLAN what the planner makes now from SPEC
with these options? Decided here, worded in planner/review/lockfile_render.py.

The committed plan is compared after loading, not byte for byte: a plan is the same when every
field is equal, predictions included (they follow from the same spec, options and hardware
profile), whatever its file format (YAML or JSON), layout or line endings (a checkout that turned
them into CRLF). It is compared with the plan made now, committed -> now, so the diff shows what
refreshing would change. Verdicts:

- ``same``: exit 0.
- ``changed``: the same spec (``summary.spec_sha256``), another plan (a changed option, or a
  planner that decides differently now): exit 1 with the diff.
- ``other_spec``: the plan records another spec's hash: exit 1 with the diff.
- ``older_version``: a plan an older planner wrote (a ``plan_version`` below this planner's), which
  no longer loads: stale, exit 1, no diff. A plan that does not load for any other reason (a newer
  ``plan_version``, a file that is not a plan, a hand edit that contradicts itself) is bad input.

Every verdict but ``same`` carries the command that rewrites the plan: the user's own command line
with ``-o PLAN`` instead of ``--check PLAN``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.errors import InputError
from schemas.io import load_model, parse_text, read_text, source_name
from schemas.plan import Plan
from schemas.plan_content import PLAN_VERSION

from planner.cli import exit_codes
from planner.review.diff import PlanDiff, diff_plans

SAME, CHANGED, OTHER_SPEC, OLDER_VERSION = "same", "changed", "other_spec", "older_version"
STDIN_PLAN = "PLAN"  # the refresh command's -o when the committed plan came on stdin


@dataclass(frozen=True)
class Check:
    """The verdict on a committed plan."""

    status: str  # SAME, CHANGED, OTHER_SPEC or OLDER_VERSION
    plan: str  # the committed plan, as named in messages (<stdin>)
    spec: str  # the spec, likewise
    command: str  # the plan command checked: planner plan SPEC [options]
    refresh: str  # the command that rewrites the committed plan: ... -o PLAN
    diff: PlanDiff | None = None  # committed -> now (changed, other_spec)
    plan_sha256: str | None = None  # the spec hash the committed plan records
    spec_sha256: str | None = None  # the spec's hash
    plan_version: int | None = None  # of the committed plan, when it is older

    @property
    def exit_code(self) -> int:
        return exit_codes.OK if self.status == SAME else exit_codes.CHANGED


def check_flags(spec: str, check: str | None, output: str | None, diff_format_given: bool) -> None:
    """The flags that go with --check (and only with it), or InputError."""
    if check is None:
        if diff_format_given:
            raise InputError("--diff-format: only with --check PLAN (to compare two plan files: planner diff OLD NEW)")
        return
    if output is not None:
        raise InputError(f"--check compares with {source_name(check)} and writes nothing, -o {output} writes the "
                         "plan: give one of them (to refresh the plan: the same command with -o instead of --check)")
    if spec == "-" and check == "-":
        raise InputError("SPEC and --check both read stdin: give one of them as a file")


def check_plan(fresh: Plan, spec: str, committed_path: str, options: Sequence[str]) -> Check:
    """The verdict on the plan in ``committed_path`` (``-``: stdin) against ``fresh``, made by
    ``planner plan SPEC`` with ``options`` (the words of the options as given, no --check or -o)."""
    name = source_name(committed_path)
    text = read_text(committed_path)
    words = [spec, *options]
    command = "planner plan " + shlex.join(words)
    refresh = "planner plan " + shlex.join([*words, *_format_words(text, options),
                                            "-o", STDIN_PLAN if committed_path == "-" else committed_path])
    where = {"plan": name, "spec": source_name(spec), "command": command, "refresh": refresh}
    try:
        committed = load_model(Plan, committed_path, text)
    except InputError:
        version = older_version(text, name)
        if version is None:
            raise
        return Check(OLDER_VERSION, plan_version=version, **where)
    if committed == fresh:
        return Check(SAME, **where)
    old_sha, new_sha = committed.summary.spec_sha256, fresh.summary.spec_sha256
    return Check(CHANGED if old_sha == new_sha else OTHER_SPEC, diff=diff_plans(committed, fresh),
                 plan_sha256=old_sha, spec_sha256=new_sha, **where)


def older_version(text: str, name: str) -> int | None:
    """The ``plan_version`` of a plan file an older planner wrote (1 up to below this planner's), else None."""
    try:
        data = parse_text(text, name)
    except InputError:
        return None
    version = data.get("plan_version")
    return version if type(version) is int and 1 <= version < PLAN_VERSION else None


def _format_words(text: str, options: Sequence[str]) -> list[str]:
    """``--format json`` for a committed plan in JSON when the command gives no --format, so that
    refreshing keeps the file's format."""
    if "--format" in options or not text.lstrip().startswith("{"):
        return []
    return ["--format", "json"]
