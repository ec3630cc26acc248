"""Every source file compiles without a warning: an invalid escape sequence in a string is a SyntaxWarning today
and an error in a later Python (one reached a run on the GPU machine, in a docstring of planner/strategy/auto.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for folder in ("planner", "runtime", "schemas", "bench", "examples", "tests")
                 for p in (ROOT / folder).rglob("*.py"))


def test_there_are_sources():
    assert len(SOURCES) > 50


@pytest.mark.parametrize("folder", ["planner", "runtime", "schemas", "bench", "examples", "tests"])
def test_sources_compile_without_warnings(folder):
    problems = []
    for path in (p for p in SOURCES if p.relative_to(ROOT).parts[0] == folder):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
        problems += [f"{path.relative_to(ROOT)}:{w.lineno}: {w.message}" for w in seen]
    assert not problems, "\n".join(problems)
