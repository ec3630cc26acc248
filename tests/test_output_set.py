"""A set of files is written all or none (planner/cli/output_set.py): a failure injected at any step of any file
leaves the folder exactly as it was, with no temporary file; the error names the user's path."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from cli_samples import TINY_SPEC, invoke
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from planner.cli.output_set import write_set
from schemas.io import load_model
from schemas.spec import SpecFile

NAMES = [f"rank{r}.plan.{fmt}" for r in range(4) for fmt in ("yaml", "json")] + ["notes.txt"]
STEPS = ("fsync", "link", "replace")  # the calls each file of a set goes through


class Injected(OSError):
    pass


def _failing(monkeypatch: pytest.MonkeyPatch, step: str, at: int) -> None:
    """``os.<step>`` fails on its ``at``-th call (0-based), and only then."""
    real = getattr(os, step)
    calls = iter(range(10**6))

    def call(*args: object, **kwargs: object) -> object:
        if next(calls) == at:
            raise Injected(5, "injected failure", str(args[-1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(os, step, call)


def _state(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@settings(max_examples=60, deadline=None)
@given(
    old=st.dictionaries(st.sampled_from(NAMES), st.binary(max_size=20), max_size=5),
    new=st.dictionaries(st.sampled_from(NAMES), st.text(max_size=20), min_size=1, max_size=4),
    remove=st.sets(st.sampled_from(NAMES), max_size=3),
    step=st.sampled_from(STEPS),
    at=st.integers(0, 8),
)
def test_a_failure_anywhere_leaves_the_folder_as_it_was(
        old: dict[str, bytes], new: dict[str, str], remove: set[str], step: str, at: int) -> None:
    remove = {name for name in remove if name in old and name not in new}
    with pytest.MonkeyPatch.context() as monkeypatch, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, data in old.items():
            (folder / name).write_bytes(data)
        before = _state(folder)
        _failing(monkeypatch, step, at)
        try:
            write_set({folder / n: text for n, text in new.items()}, [folder / n for n in sorted(remove)])
        except Injected:
            raise AssertionError("the injected error escaped unnamed") from None
        except OSError as err:
            assert "injected failure" in str(err) and "nothing of the set was written" in str(err)
            assert err.filename in {str(folder / n) for n in [*new, *remove]}, err.filename
            monkeypatch.undo()
            assert _state(folder) == before
            return
        monkeypatch.undo()
        after = {**{n: d for n, d in before.items() if n not in remove}, **{n: t.encode() for n, t in new.items()}}
        assert _state(folder) == dict(sorted(after.items()))


def _tiny_ranks(world: int) -> list:
    spec = load_model(SpecFile, "tiny.yaml", TINY_SPEC)
    return planner.plan_ranks(spec, world, backend="none", gpu_budget=10**6)


@pytest.mark.parametrize("step", STEPS)
def test_a_rank_set_is_rewritten_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     step: str) -> None:
    """Every failure point of rewriting a 4-rank set as a 2-rank set (two files replaced, two removed). A
    failed hard link falls back to a rename, so it is no failure of the set."""
    planner.write_rank_plans(_tiny_ranks(4), tmp_path)
    (tmp_path / "notes.txt").write_text("kept")
    before = _state(tmp_path)
    two = _tiny_ranks(2)
    failures = 0
    for at in range(8):
        with monkeypatch.context() as patch:
            _failing(patch, step, at)
            try:
                planner.write_rank_plans(two, tmp_path)
            except OSError as err:
                failures += 1
                assert err.filename.startswith(str(tmp_path / "rank")), err.filename
                assert ".tmp" not in str(err) and ".old" not in str(err)
        if failures and _state(tmp_path) == before:
            continue
        assert sorted(_state(tmp_path)) == ["notes.txt", "rank0.plan.yaml", "rank1.plan.yaml"]
        for name, data in before.items():  # the old set again, for the next failure point
            (tmp_path / name).write_bytes(data)
    assert failures >= (0 if step == "link" else 2)


def test_a_folder_in_the_way_refuses_the_set(tmp_path: Path) -> None:
    """The reported case: rank1's file is a folder; rank 0 keeps its old plan, no temporary file is left."""
    out = tmp_path / "set"
    assert invoke("plan", "{}".format(_spec(tmp_path)), "--tp", "2", "-g", "1MB", "-o", str(out)).exit_code == 0
    (out / "rank1.plan.yaml").unlink()
    (out / "rank1.plan.yaml").mkdir()
    before = (out / "rank0.plan.yaml").read_bytes()
    result = invoke("plan", str(_spec(tmp_path)), "--tp", "2", "-g", "1MB", "--backend", "none", "-o", f"{out}/")
    assert result.exit_code == 2, result.output
    assert f"{out}/rank1.plan.yaml: cannot write: Is a directory" in result.output
    assert "nothing of the set was written" in result.output and ".tmp" not in result.output
    assert (out / "rank0.plan.yaml").read_bytes() == before
    assert sorted(os.listdir(out)) == ["rank0.plan.yaml", "rank1.plan.yaml"]


def test_a_new_folder_is_removed_when_the_set_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _failing(monkeypatch, "replace", 1)
    with pytest.raises(OSError, match="nothing of the set was written"):
        planner.write_rank_plans(_tiny_ranks(2), tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []


def _spec(folder: Path) -> Path:
    path = folder / "tiny.yaml"
    path.write_text(TINY_SPEC)
    return path
