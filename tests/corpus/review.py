"""`planner check-plans` with a plans manifest or changed files it cannot use: exit 2 with the file,
the manifest line and what is expected. (A plan out of date or missing is no such case: it is
exit 1, tests/test_review_workflow.py.) The manifest is ``{d}/planner-plans.sh``; its paths are
relative to its folder."""

from __future__ import annotations

from pathlib import Path

from corpus.case import CliCase
from corpus.lockfile import SPEC, committed_plan

CHECK = ("check-plans", "--manifest", "{d}/planner-plans.sh")
GOOD_LINE = "planner plan spec.yaml -o plan.yaml\n"


def _with_plan(d: Path) -> None:
    (d / "plan.yaml").write_text(committed_plan())


def _case(id: str, manifest: str | bytes | None, *given: str, expect: tuple[str, ...],
          files: dict[str, str | bytes] | None = None, setup=None) -> CliCase:
    written: dict[str, str | bytes] = {"spec.yaml": SPEC, **(files or {})}
    if manifest is not None:
        written["planner-plans.sh"] = manifest
    return CliCase(id=f"review-{id}", args=(*CHECK, *given), files=written, setup=setup or _with_plan,
                   exit=2, expect=expect)


CASES = [
    # the manifest itself
    _case("manifest-missing", None, expect=("planner-plans.sh: no such file", "one `planner plan SPEC")),
    _case("manifest-a-broken-link", None, expect=("planner-plans.sh: cannot read",),
          setup=lambda d: (d / "planner-plans.sh").symlink_to(d / "gone.sh")),
    _case("manifest-empty", "", expect=("no plan command in it",)),
    _case("manifest-only-comments", "# plans\n\n# none yet\n", expect=("no plan command in it",)),
    _case("manifest-not-utf8", b"planner plan spec.yaml -o plan.yaml\n\xff\xfe\n",
          expect=("not a text file", "expected one `planner plan")),
    _case("manifest-is-a-folder", None, expect=("is a directory",), files={"planner-plans.sh/x": "a"}),
    _case("manifest-written-as-yaml", "plans:\n  - planner plan spec.yaml -o plan.yaml\n",
          expect=("planner-plans.sh:1: 'plans:': expected one `planner plan SPEC [options] -o PLAN` command a line",)),
    _case("line-another-command", GOOD_LINE + "planner show plan.yaml\n",
          expect=("planner-plans.sh:2:", "'planner show'")),
    _case("line-other-program", "python make_plans.py\n", expect=("'python make_plans.py'",)),
    _case("line-planner-alone", "planner\n", expect=("'planner'",)),
    _case("line-misspelled-option", "planner plan spec.yaml --gpu-budgt 12GB -o plan.yaml\n",
          expect=("planner-plans.sh:1:", "No such option: --gpu-budgt", "--gpu-budget")),
    _case("line-option-out-of-range", "planner plan spec.yaml --group-size 0 -o plan.yaml\n",
          expect=("planner-plans.sh:1:", "--group-size")),
    _case("line-bad-choice", "planner plan spec.yaml --backend fast -o plan.yaml\n",
          expect=("planner-plans.sh:1:", "--backend", "fast")),
    _case("line-no-output", "planner plan spec.yaml --gpu-budget 8KB\n", expect=("no -o PLAN",)),
    _case("line-output-stdout", "planner plan spec.yaml -o -\n", expect=("no -o PLAN",)),
    _case("line-redirect-instead-of-o", "planner plan spec.yaml > plan.yaml\n", expect=("'>': a line is one plan command",)),
    _case("line-with-check", "planner plan spec.yaml --check plan.yaml -o plan.yaml\n",
          expect=("--check: check-plans adds --check itself",)),
    _case("line-with-diff-format", "planner plan spec.yaml --diff-format markdown -o plan.yaml\n",
          expect=("--diff-format: check-plans adds --check itself",)),
    _case("line-spec-on-stdin", "planner plan - -o plan.yaml\n", expect=("SPEC is '-' (stdin)",)),
    _case("line-no-spec", "planner plan -o plan.yaml\n", expect=("planner-plans.sh:1:", "SPEC")),
    _case("line-help", "planner plan --help\n", expect=("planner-plans.sh:1: --help makes no plan",)),
    _case("line-variable", "planner plan $SPEC -o plan.yaml\n", expect=("'$': a line is one plan command",)),
    _case("line-home-tilde", "planner plan ~/spec.yaml -o plan.yaml\n", expect=("'~': a line is one plan command",)),
    _case("line-glob", "planner plan spec*.yaml -o plan.yaml\n", expect=("'*': a line is one plan command",)),
    _case("line-pipe", "planner plan spec.yaml -o plan.yaml | tee log\n", expect=("'|': a line is one plan command",)),
    _case("line-two-commands", "planner plan spec.yaml -o plan.yaml; planner show plan.yaml\n",
          expect=("';': a line is one plan command",)),
    _case("line-hash-inside-a-word", "planner plan spec.yaml -o plan#1.yaml\n", expect=("'#': a line is one plan command",)),
    _case("line-unclosed-quote", "planner plan 'spec.yaml -o plan.yaml\n", expect=("No closing quotation",)),
    _case("line-continued-past-the-end", "planner plan spec.yaml \\\n", expect=("no -o PLAN",)),
    # what sh would read otherwise (planner/review/manifest_lines.py; tests/test_manifest_lines.py compares with sh)
    _case("line-crlf", GOOD_LINE.replace("\n", "\r\n"), expect=("planner-plans.sh:1: a carriage return",
                                                                "LF line ends")),
    _case("line-crlf-on-the-second-line", GOOD_LINE + "planner plan spec.yaml -o b.yaml\r\n",
          expect=("planner-plans.sh:2: a carriage return",)),
    _case("manifest-with-bom", "\ufeff" + GOOD_LINE, expect=("planner-plans.sh:1: a byte-order mark",)),
    _case("line-backslash-then-space", "planner plan spec.yaml \\ \n  -o plan.yaml\n",
          expect=("planner-plans.sh:1: '\\' and then spaces end the line",)),
    _case("line-backslash-in-quotes", "planner plan 'spec.yaml\\\n' -o plan.yaml\n",
          expect=("planner-plans.sh:1: a backslash ends the line inside quotes",)),
    _case("line-escaped-char", "planner plan spec.yaml -o plan\\ 1.yaml\n", expect=("'\\': a line is one",)),
    _case("line-form-feed", "planner plan spec.yaml -o plan.yaml\x0c\n", expect=("control character (U+000C)",)),
    _case("line-nul", "planner plan spec.yaml -o plan.yaml\x00\n", expect=("control character (U+0000)",)),
    _case("every-bad-line-at-once", "planner plan spec.yaml\n" + GOOD_LINE + "planner plan $X -o y.yaml\n",
          expect=("planner-plans.sh:1: no -o PLAN", "planner-plans.sh:3: '$': a line")),
    _case("plan-made-twice", GOOD_LINE + "planner plan spec.yaml --backend uva -o plan.yaml\n",
          expect=("planner-plans.sh:2:", "line 1 makes this plan already")),
    _case("plan-made-twice-spelled-apart", GOOD_LINE + "planner plan spec.yaml -o ./sub/../plan.yaml\n",
          expect=("line 1 makes this plan already",)),
    # what a line names
    _case("line-spec-missing", "planner plan gone.yaml -o plan.yaml\n",
          expect=("gone.yaml: no such file", "hint: ", "planner-plans.sh line 1")),
    _case("line-spec-neither-spec-nor-plan", "planner plan notes.yaml -o plan.yaml\n",
          files={"notes.yaml": "title: release notes\nitems: [a, b]\n"},
          expect=("notes.yaml", "model", "planner-plans.sh line 1")),
    _case("line-spec-is-a-plan", "planner plan plan.yaml -o plan.yaml\n",
          expect=("this is a plan file, not a spec", "planner-plans.sh line 1")),
    _case("line-plan-is-the-spec", "planner plan spec.yaml -o spec.yaml\n",
          expect=("this is a spec file, not a plan", "planner-plans.sh line 1")),
    _case("line-hardware-file-missing", "planner plan spec.yaml --hardware gpu.yaml -o plan.yaml\n",
          expect=("gpu.yaml: no such file", "planner-plans.sh line 1")),
    _case("line-hardware-unknown-name", "planner plan spec.yaml --hardware h2000 -o plan.yaml\n",
          expect=("no bundled profile 'h2000'", "planner-plans.sh line 1")),
    # the changed files given
    _case("given-file-missing", GOOD_LINE, "{d}/deleted.yaml", expect=("deleted.yaml: no such file",)),
    _case("given-folder", GOOD_LINE, "{d}", expect=("is a directory, not a file",)),
    _case("given-plan-without-a-line", GOOD_LINE, "{d}/orphan.plan.yaml",
          files={"orphan.plan.yaml": committed_plan()},
          expect=("orphan.plan.yaml: a plan that no line of", "add the command that makes it there")),
    _case("given-plan-json-without-a-line", GOOD_LINE, "{d}/orphan.json",
          files={"orphan.json": committed_plan(fmt="json")}, expect=("orphan.json: a plan that no line of",)),
    _case("given-old-plan-without-a-line", GOOD_LINE, "{d}/v1.yaml",
          files={"v1.yaml": "plan_version: 1\nsummary: {}\nlayers: []\n"}, expect=("v1.yaml: a plan that no line of",)),
    CliCase(id="review-diff-format-json", args=(*CHECK, "--diff-format", "json"),
            files={"spec.yaml": SPEC, "planner-plans.sh": GOOD_LINE}, exit=2, expect=("--diff-format", "json")),
]
