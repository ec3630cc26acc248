"""Plans of the old step rule (plan_version 1: prefetch_step meant slots - 1) and step mistakes.

A plan written before ``prefetch_step`` became the number of buffer slots (vLLM's meaning) is
refused on load with one message naming the file and the line of ``plan_version``, wherever it
is read: ``planner validate``/``show``/``diff``, ``runtime.apply`` and ``Plan`` in
Python. A plan whose version was bumped by hand without re-planning is caught by the plan
check (its slots follow the old rule).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from corpus.case import ApiCase, CliCase
from corpus.plans import setter, valid_plan_data
from schemas import InputError
from schemas.yaml_write import dump_yaml

OLD = "plan_version 1: this plan was written by an older planner whose prefetch_step meant slots - 1"
AGAIN = "make the plan again with `planner plan SPEC`"


def _old(kind: str = "prefetch", edit: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """A plan as the older planner wrote it: version 1 (with 2 slots it said prefetch_step 1)."""
    data = valid_plan_data(kind)
    data["plan_version"] = 1
    if kind == "prefetch":
        data["summary"]["prefetch_step"] = 1
    if edit is not None:
        edit(data)
    return data


def _files(**texts: Callable[[], str]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        for name, text in texts.items():
            (d / name).write_text(text())
    return setup


def _yaml(data: Callable[[], dict[str, Any]]) -> Callable[[], str]:
    return lambda: dump_yaml(data())


def _commented_yaml() -> str:
    """An old plan someone annotated: plan_version is on line 3."""
    return "# llama 12 GB, reviewed\n# (do not edit by hand)\n" + dump_yaml(_old())


def _reordered_yaml() -> str:
    """plan_version written last, as a tool that sorts keys might."""
    data = _old()
    version = data.pop("plan_version")
    data["plan_version"] = version
    return dump_yaml(data)


def _bumped(data: dict[str, Any]) -> None:
    """An old plan whose version was changed to 2 by hand, slots and schedule left as they were."""
    data["plan_version"] = 2


def _apply_old_file(d: Path) -> object:
    import runtime
    from corpus.plans import _model_for, _runtime_plan_json

    data = json.loads(_runtime_plan_json())
    data["plan_version"], data["summary"]["prefetch_step"] = 1, 1
    (d / "old.plan.yaml").write_text(dump_yaml(data))
    return runtime.apply(d / "old.plan.yaml", _model_for(d), device="cpu")


def _unchanged(d: Path) -> None:
    from corpus.plans import _unchanged as check

    check(d)


def _validate_old_in_python(d: Path) -> object:
    from schemas import Plan

    return Plan.model_validate(_old())


def _load_old_in_python(d: Path) -> object:
    from schemas import load_plan

    (d / "old.json").write_text(json.dumps(_old("uva"), indent=1))
    return load_plan(d / "old.json")


CASES: list[CliCase | ApiCase] = [
    CliCase("old-plan-validate", ("validate", "{d}/old.plan.yaml"), setup=_files(**{"old.plan.yaml": _yaml(_old)}),
            expect=("old.plan.yaml:1: " + OLD, AGAIN)),
    CliCase("old-plan-show-after-comments", ("show", "{d}/old.plan.yaml"),
            setup=_files(**{"old.plan.yaml": _commented_yaml}), expect=("old.plan.yaml:3: " + OLD,)),
    CliCase("old-plan-version-last", ("validate", "{d}/old.plan.yaml"),
            setup=_files(**{"old.plan.yaml": _reordered_yaml}), expect=(OLD, AGAIN)),
    CliCase("old-plan-uva-json", ("show", "{d}/old.json", "--format", "json"),
            setup=_files(**{"old.json": lambda: json.dumps(_old("uva"), indent=1)}), expect=("old.json:2: " + OLD,)),
    CliCase("old-plan-diff-against-new", ("diff", "{d}/new.plan.yaml", "{d}/old.plan.yaml"),
            setup=_files(**{"new.plan.yaml": _yaml(lambda: valid_plan_data("prefetch")),
                            "old.plan.yaml": _yaml(_old)}), expect=("old.plan.yaml:1: " + OLD,)),
    CliCase("old-plan-none-backend", ("validate", "{d}/old.plan.yaml"),
            setup=_files(**{"old.plan.yaml": _yaml(lambda: _old("none"))}), expect=("old.plan.yaml:1: " + OLD,)),
    # the version alone is reported, not what the old rule made of the slots (or an edit beside it)
    CliCase("old-plan-with-hand-edit", ("validate", "{d}/old.plan.yaml"),
            setup=_files(**{"old.plan.yaml": _yaml(lambda: _old(edit=setter("summary/peak_gpu_bytes", 1)))}),
            expect=(OLD,)),
    CliCase("old-plan-from-stdin-cut-short", ("show", "-"), stdin="# pasted from a review\nplan_version: 1\nsummary: {}\n",
            expect=("<stdin>:2: " + OLD,)),
    CliCase("plan-version-from-the-future", ("validate", "{d}/p.yaml"),
            setup=_files(**{"p.yaml": _yaml(lambda: {**valid_plan_data("uva"), "plan_version": 3})}),
            expect=("p.yaml:1: plan_version: expected 2 (got 3)",)),
    CliCase("plan-version-as-text", ("validate", "{d}/p.yaml"),
            setup=_files(**{"p.yaml": _yaml(lambda: {**valid_plan_data("uva"), "plan_version": "1"})}),
            expect=("plan_version: expected 2 (got '1')",)),
    CliCase("old-plan-bumped-by-hand", ("validate", "{d}/p.yaml"),
            setup=_files(**{"p.yaml": _yaml(lambda: _old(edit=_bumped))}),
            expect=("buffer_pool.slots: 2 in the file, 1 from the schedule of prefetch_step 1 over 4 offloaded layers "
                    "in 1 slot; that is the old rule (plan_version 1, where prefetch_step meant slots - 1): make the "
                    "plan again", "layers[3].prefetch.slot: 1 in the file, 0 from")),
    ApiCase("old-plan-apply-file", _apply_old_file, InputError, ("old.plan.yaml:1: " + OLD, AGAIN), after=_unchanged),
    ApiCase("old-plan-model-validate", _validate_old_in_python, ValidationError, (OLD, AGAIN)),
    ApiCase("old-plan-load-plan", _load_old_in_python, InputError, ("old.json:2: " + OLD,)),
]
