"""`planner plan SPEC --check PLAN` with a committed plan it cannot judge or flags that do not go
together: exit 2 with the usual message. (A plan an older planner wrote is no such case: it is stale,
exit 1, tests/test_lockfile.py.) ``SPEC`` and ``committed_plan`` are shared with that test."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli_samples import TINY_SPEC

from corpus.case import CliCase

SPEC = TINY_SPEC.replace("gpu_budget: 2KB", "gpu_budget: 8KB")  # a uva spec; 3200 bytes is its smallest budget


def committed_plan(spec_text: str = SPEC, fmt: str = "yaml", **options: Any) -> str:
    """The text `planner plan` writes for ``spec_text`` with ``options`` (planner.plan's keywords)."""
    import planner
    from schemas.io import dump_model, parse_text
    from schemas.spec import SpecFile

    return dump_model(planner.plan(SpecFile.model_validate(parse_text(spec_text, "spec")), **options), fmt)


def _write_plan(edit: Callable[[dict[str, Any]], None] | None = None) -> Callable[[Path], None]:
    """A setup writing the committed plan (after ``edit`` on its data, written as JSON) into the folder."""
    def setup(d: Path) -> None:
        text = committed_plan()
        if edit is not None:
            data = json.loads(committed_plan(fmt="json"))
            edit(data)
            text = json.dumps(data, indent=1)
        (d / "plan.yaml").write_text(text)
    return setup


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data[key] = value
    return edit


def _peak(data: dict[str, Any]) -> None:
    data["summary"]["peak_gpu_bytes"] += 2


FILES = {"spec.yaml": SPEC}
CHECK = ("plan", "{d}/spec.yaml", "--check")


def _case(id: str, *args: str, expect: tuple[str, ...], files: dict[str, str | bytes] | None = None,
          setup: Callable[[Path], None] | None = None, stdin: str | None = None) -> CliCase:
    return CliCase(id=f"lockfile-{id}", args=args, files={**FILES, **(files or {})}, setup=setup, stdin=stdin,
                   exit=2, expect=expect)


CASES = [
    _case("missing-plan", *CHECK, "{d}/plan.yaml", expect=("plan.yaml: no such file",)),
    _case("plan-is-a-folder", *CHECK, "{d}", expect=("is a directory, not a file",)),
    _case("plan-is-the-spec", *CHECK, "{d}/spec.yaml", expect=("this is a spec file, not a plan",)),
    _case("plan-empty", *CHECK, "{d}/plan.yaml", files={"plan.yaml": ""}, expect=("plan.yaml: the file is empty",)),
    _case("plan-not-utf8", *CHECK, "{d}/plan.yaml", files={"plan.yaml": b"plan_version: 2\n\xff\xfe"},
          expect=("not a text file",)),
    _case("plan-a-list", *CHECK, "{d}/plan.yaml", files={"plan.yaml": "- plan_version: 2\n"},
          expect=("the top level is a list",)),
    _case("plan-malformed-yaml", *CHECK, "{d}/plan.yaml", files={"plan.yaml": "plan_version: 2\nsummary: [1,\n"},
          expect=("plan.yaml:",)),
    _case("plan-newer-version", *CHECK, "{d}/plan.yaml", setup=_write_plan(_set("plan_version", 3)),
          expect=("plan_version: expected 2 (got 3)",)),
    _case("plan-version-zero", *CHECK, "{d}/plan.yaml", setup=_write_plan(_set("plan_version", 0)),
          expect=("plan_version", "got 0")),
    _case("plan-version-as-text", *CHECK, "{d}/plan.yaml", setup=_write_plan(_set("plan_version", "1")),
          expect=("plan_version",)),
    _case("plan-contradicts-itself", *CHECK, "{d}/plan.yaml", setup=_write_plan(_peak),
          expect=("summary.peak_gpu_bytes",)),
    _case("plan-unknown-key", *CHECK, "{d}/plan.yaml", setup=_write_plan(_set("sumary", {})),
          expect=("sumary", "unknown key")),
    _case("plan-on-stdin-not-a-plan", *CHECK, "-", stdin="hello: world\n", expect=("<stdin>",)),
    _case("check-with-output", *CHECK, "{d}/plan.yaml", "-o", "{d}/plan.yaml", setup=_write_plan(),
          expect=("--check compares with", "give one of them")),
    _case("check-with-output-stdout", *CHECK, "{d}/plan.yaml", "-o", "-", setup=_write_plan(),
          expect=("--check compares with", "-o -")),
    _case("spec-and-plan-on-stdin", "plan", "-", "--check", "-", stdin=SPEC, expect=("both read stdin",)),
    _case("diff-format-without-check", "plan", "{d}/spec.yaml", "--diff-format", "markdown",
          expect=("--diff-format: only with --check",)),
    _case("diff-format-unknown", *CHECK, "{d}/plan.yaml", "--diff-format", "html", setup=_write_plan(),
          expect=("--diff-format", "html")),
    _case("check-without-plan", *CHECK, expect=("--check", "requires an argument")),
    _case("bad-spec-with-good-plan", "plan", "{d}/bad.yaml", "--check", "{d}/plan.yaml", setup=_write_plan(),
          files={"bad.yaml": SPEC.replace("backend: uva", "backend: uvm")}, expect=("bad.yaml:", "offload.backend")),
    _case("bad-option-with-good-plan", *CHECK, "{d}/plan.yaml", "--gpu-budget", "12 GX", setup=_write_plan(),
          expect=("--gpu-budget",)),
]
