"""The words of a `planner plan --check` verdict (planner/review/lockfile.py decides it): text, markdown for
a pull request, json for tools. Text and markdown give the diff (committed -> now) first, then the
verdict with the command that refreshes the plan, as the last line in text."""

from __future__ import annotations

import json

from schemas.plan_content import PLAN_VERSION
from schemas.rank_plans import rank_plan_name

from planner.review.diff_render import render_diff
from planner.review.lockfile import CHANGED, OLDER_VERSION, OTHER_SPEC, SAME, Check
from planner.review.lockfile_set import SetCheck

SHA_SHOWN = 12  # hex digits of a spec hash in a sentence


def render_check(check: Check, fmt: str = "text") -> str:
    """Render as ``text``, ``markdown`` or ``json`` (the diff formats of `planner diff`)."""
    if fmt == "json":
        return json.dumps(_json(check), indent=2) + "\n"
    md = fmt == "markdown"
    diff = render_diff(check.diff, fmt) if check.diff is not None else ""
    if check.status == SAME:
        return verdict(check, md) + "\n"
    if md:
        return f"{diff}\n{verdict(check, md)} Refresh with:\n\n```sh\n{check.refresh}\n```\n".lstrip("\n")
    return f"{diff}{verdict(check, md)}; refresh with: {check.refresh}\n"


def verdict(check: Check, md: bool = False) -> str:
    """One sentence: whether the committed plan is up to date, and if not, why (no refresh command)."""
    def code(s: str) -> str:
        return f"`{s}`" if md else s

    plan, spec, command = code(check.plan), code(check.spec), code(check.command)
    if check.status == SAME:
        text = f"{plan} is up to date: {command} makes the same plan"
        return text + "." if md else text
    if check.status == CHANGED:
        arrow = "→" if md else "->"
        said = (f"{plan} is out of date: {spec} with these options makes another plan "
                f"(the diff above: committed {arrow} now)")
    elif check.status == OTHER_SPEC:
        said = (f"{plan} was made from another spec (sha {_sha(check.plan_sha256)}; "
                f"{spec} has sha {_sha(check.spec_sha256)})")
    elif check.status == OLDER_VERSION:
        said = (f"stale: {plan} was made by an older planner (plan_version {check.plan_version}; "
                f"this planner writes {PLAN_VERSION})")
    else:
        raise ValueError(f"unknown check status {check.status!r}")
    return f"**{said}**." if md else said


def _sha(sha: str | None) -> str:
    return (sha or "none")[:SHA_SHOWN]


def _json(check: Check) -> dict:
    return {
        "status": check.status,
        "up_to_date": check.status == SAME,
        "plan": check.plan,
        "spec": check.spec,
        "command": check.command,
        "message": verdict(check),
        "refresh": None if check.status == SAME else check.refresh,
        "plan_version": check.plan_version,
        "spec_sha256": {"plan": check.plan_sha256, "spec": check.spec_sha256},
        "diff": None if check.diff is None else json.loads(render_diff(check.diff, "json")),
    }


def render_set_check(check: SetCheck, fmt: str = "text") -> str:
    """A rank set's verdicts: each rank's as `render_check` words it, then one line for the set."""
    if fmt == "json":
        return json.dumps({"folder": check.folder, "up_to_date": check.up_to_date,
                           "committed_ranks": check.committed_ranks, "made_ranks": check.made_ranks,
                           "missing_ranks": list(check.missing),
                           "refresh": None if check.up_to_date else check.refresh,
                           "ranks": [_json(c) for c in check.ranks]}, indent=2) + "\n"
    md = fmt == "markdown"
    parts = [render_check(c, fmt) for c in check.ranks]
    same = sum(c.status == SAME for c in check.ranks)
    line = f"rank set {check.folder}: {same} of {check.made_ranks} rank plans up to date"
    if check.committed_ranks != check.made_ranks:
        line += (f"; the folder holds {check.committed_ranks} rank plans and the command makes {check.made_ranks}")
    if check.missing:
        line += f"; missing from the folder: {', '.join(rank_plan_name(r) for r in check.missing)}"
    if check.up_to_date:
        return "".join(parts) + line + "\n"
    tail = f"\n```sh\n{check.refresh}\n```\n" if md else f"; refresh with: {check.refresh}\n"
    return "".join(parts) + line + (" Refresh with:\n" + tail if md else tail)
