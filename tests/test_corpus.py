"""Runs the bad-input corpus (tests/corpus/*.py): expected exit code or exception, message
fragments, never a traceback."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
from cli_samples import invoke

import corpus
from corpus.case import ApiCase, CliCase


def _collect() -> list[CliCase | ApiCase]:
    cases: list[CliCase | ApiCase] = []
    for info in sorted(pkgutil.iter_modules(corpus.__path__), key=lambda i: i.name):
        if info.name == "case":
            continue
        module = importlib.import_module(f"corpus.{info.name}")
        cases += [c for c in getattr(module, "CASES", [])]
    return cases


CASES = _collect()


def test_corpus_is_large_and_distinct() -> None:
    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: CliCase | ApiCase, tmp_path: Path) -> None:
    if isinstance(case, ApiCase):
        with pytest.raises(case.error) as info:
            case.call(tmp_path)
        text = str(info.value)
        for fragment in case.expect:
            assert fragment in text, f"{fragment!r} not in:\n{text}"
        if case.after is not None:
            case.after(tmp_path)
        return
    for name, content in case.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    if case.setup is not None:
        case.setup(tmp_path)
    args = [a.format(f=tmp_path / "bad.yaml", d=tmp_path) for a in case.args]
    result = invoke(*args, stdin=case.stdin)
    out = result.output
    assert result.exit_code == case.exit, (result.exit_code, out, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out
    for fragment in case.expect:
        assert fragment in out, f"{fragment!r} not in:\n{out}"
