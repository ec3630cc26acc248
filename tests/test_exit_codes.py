"""Exit codes of the `planner` command: every error carries its own (PlannerError.exit_code), a
closed stdout ends quietly with 141, an internal error exits 70 with one line naming it a bug."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_samples import TINY_SPEC, invoke
from pydantic import BaseModel, ValidationError, model_validator

from planner.cli import errors as cli_errors

from planner.cli import exit_codes
from planner.errors import InfeasibleError, PlanningError
from planner.strategy.infeasible import Infeasible
from runtime.errors import ApplyError, PlanMismatchError
from schemas import errors as schema_errors
from schemas.errors import InputError, LocatedValueError, PlannerError, problems_from_validation
from schemas.yaml_lines import load_with_lines

ROOT = Path(__file__).resolve().parent.parent
LLAMA = str(ROOT / "examples" / "llama-3-8b.yaml")
BIG = str(ROOT / "examples" / "generated" / "qwen3-30b-a3b.yaml")


# ---------------------------------------------------------------------------
# one base class that carries the exit code


@pytest.mark.parametrize("error, code, also", [
    (InputError("spec.yaml:3: model: required key is missing"), 2, ()),
    (PlanningError("strategy group needs a block stack"), 2, ()),
    (InfeasibleError(Infeasible("backend_none", 100, None, 123, total_bytes=123)), 1, ()),
    (PlanMismatchError(["layer 'x' is missing"], "toy"), 2, (ValueError,)),
    (ApplyError("CUDA is not available"), 1, (RuntimeError,)),
])
def test_every_error_derives_from_the_base_and_carries_its_code(error: PlannerError, code: int,
                                                                also: tuple[type, ...]) -> None:
    assert isinstance(error, PlannerError) and error.exit_code == code
    assert all(isinstance(error, cls) for cls in also)
    assert error.message == str(error) and error.message


def test_the_cli_table_agrees_with_the_error_classes() -> None:
    assert exit_codes.BAD_INPUT == schema_errors.EXIT_BAD_INPUT == InputError.exit_code
    assert exit_codes.INFEASIBLE == schema_errors.EXIT_NOT_POSSIBLE == InfeasibleError.exit_code
    codes = {exit_codes.OK, exit_codes.INFEASIBLE, exit_codes.BAD_INPUT, exit_codes.INTERNAL_ERROR,
             exit_codes.BROKEN_PIPE, exit_codes.INTERRUPTED}
    assert len(codes) == 6  # only CHANGED shares a code (with INFEASIBLE), as documented


def test_a_new_error_class_needs_no_change_in_the_cli(capsys) -> None:
    class QuotaError(PlannerError):
        exit_code = 9

    assert cli_errors.report(QuotaError("over quota")) == 9
    assert capsys.readouterr().err == "error: over quota\n"


@pytest.mark.parametrize("make, code, fragment", [
    (lambda: _validation_error(), 2, "x: "),
    (lambda: FileNotFoundError(2, "No such file or directory", "a/b.yaml"), 2,
     "error: a/b.yaml: No such file or directory"),
    (lambda: BrokenPipeError(32, "Broken pipe"), 141, None),
    (lambda: KeyError("layers"), 70, "internal error, a bug in planner"),
])
def test_report_maps_each_kind_of_failure(capsys, make, code: int, fragment: str | None) -> None:
    assert cli_errors.report(make()) == code
    err = capsys.readouterr().err
    if fragment is None:
        assert err == ""  # a closed pipe ends quietly
    else:
        assert fragment in err and "Traceback" not in err


class _Small(BaseModel):
    x: int


def _validation_error() -> ValidationError:
    try:
        _Small.model_validate({"x": "many"})
    except ValidationError as err:
        return err
    raise AssertionError("expected a ValidationError")


# ---------------------------------------------------------------------------
# a closed pipe


def _closed_early(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `planner ARGS` with stdout a pipe whose reader is gone before anything is written."""
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli.app", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `| head -0` does
    err = proc.stderr.read()
    return subprocess.CompletedProcess(proc.args, proc.wait(), "", err)


@pytest.fixture(scope="module")
def big_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plans") / "big.plan.yaml"
    # strategy budget: it offloads every MLP here, and its plan is larger than a pipe holds
    assert invoke("plan", BIG, "-g", "12GB", "--strategy", "budget", "-o", str(path)).exit_code == 0
    assert path.stat().st_size > 64 * 1024  # more than a pipe holds
    return path


@pytest.mark.parametrize("args", [("show", "{plan}"), ("show", "{plan}", "--format", "json"),
                                  ("plan", BIG, "-g", "12GB"), ("diff", LLAMA.replace("llama-3-8b.yaml", ""), "")])
def test_a_closed_stdout_ends_quietly_with_141(big_plan: Path, tmp_path: Path, args: tuple[str, ...]) -> None:
    if args[0] == "diff":
        other = tmp_path / "other.plan.yaml"
        assert invoke("plan", BIG, "-g", "30GB", "-o", str(other)).exit_code == 0
        args = ("diff", str(big_plan), str(other))
    done = _closed_early(*(a.format(plan=big_plan) for a in args))
    assert done.returncode == exit_codes.BROKEN_PIPE, done.stderr
    assert done.stderr == ""


def test_head_on_the_command_line_sees_the_first_lines_and_a_quiet_exit(big_plan: Path) -> None:
    script = f'"{sys.executable}" -m planner.cli.app show "{big_plan}" | head -1; echo "status=${{PIPESTATUS[0]}}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    first, status = done.stdout.splitlines()
    assert first.startswith("qwen3-30b-a3b: backend")
    assert status in ("status=0", "status=141")  # 0 when head closed after the last write
    assert done.stderr == ""


# ---------------------------------------------------------------------------
# an internal error


@pytest.fixture
def buggy_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.cli import show

    def broken(_: object) -> str:
        return {}["summary"]  # a bug: KeyError

    monkeypatch.setattr(show, "describe", broken)


def test_an_internal_error_is_one_line_naming_a_bug_with_its_own_code(buggy_validate) -> None:
    result = invoke("validate", LLAMA)
    assert result.exit_code == exit_codes.INTERNAL_ERROR
    assert result.stderr.splitlines()[0] == "error: internal error, a bug in planner (please report it): KeyError: 'summary'"
    assert "--debug" in result.stderr and "Traceback" not in result.output


def test_debug_shows_the_traceback(buggy_validate) -> None:
    result = invoke("--debug", "validate", LLAMA)
    assert result.exit_code == exit_codes.INTERNAL_ERROR
    assert "Traceback (most recent call last)" in result.stderr and "in broken" in result.stderr


def test_the_debug_variable_shows_the_traceback(buggy_validate, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(exit_codes.DEBUG_ENV, "1")
    result = invoke("validate", LLAMA)
    assert result.exit_code == exit_codes.INTERNAL_ERROR and "Traceback" in result.stderr


def test_bad_input_is_still_2_not_an_internal_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_SPEC.replace("backend: uva", "backnd: uva"))
    result = invoke("validate", str(bad))
    assert result.exit_code == 2 and "did you mean 'backend'" in result.stderr


# ---------------------------------------------------------------------------
# a budget with its unit missing


def test_a_bare_number_flag_below_1mb_gets_a_unit_hint() -> None:
    result = invoke("plan", LLAMA, "--gpu-budget", "20")
    assert result.exit_code == 1
    assert "hint: --gpu-budget 20: did you mean 20GB? a bare number is a number of bytes" in result.stderr


def test_a_bare_number_in_the_file_below_1mb_gets_a_unit_hint(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC.replace("gpu_budget: 2KB", "gpu_budget: 2"))
    result = invoke("plan", str(spec), "--strategy", "budget")  # auto fits 2 bytes by putting everything on UVA
    assert result.exit_code == 1
    assert "hint: memory.gpu_budget 2: did you mean 2GB?" in result.stderr


def test_a_bare_number_from_stdin_gets_the_hint_as_well() -> None:
    result = invoke("plan", "-", "--strategy", "budget", stdin=TINY_SPEC.replace("gpu_budget: 2KB", 'gpu_budget: "3"'))
    assert result.exit_code == 1 and "memory.gpu_budget 3: did you mean 3GB?" in result.stderr


@pytest.mark.parametrize("budget", ["2KB", "999 KiB", "1500000"])
def test_no_unit_hint_for_a_size_with_a_unit_or_a_large_number(budget: str) -> None:
    result = invoke("plan", "-", "--gpu-budget", budget, stdin=TINY_SPEC)
    assert result.exit_code in (0, 1)
    assert "did you mean" not in result.stderr


# ---------------------------------------------------------------------------
# where a validator's error is: LocatedValueError first, the message regex as a fallback

STACK_YAML = """\
name: toy
layers:
  - name: a
    size: 1
  - name: b
    size: -1
  - name: c
    size: 2
"""


class _Layer(BaseModel):
    name: str
    size: int


def _problems(validator: object) -> list[schema_errors.Problem]:
    class Stack(BaseModel):
        name: str
        layers: list[_Layer]
        check = model_validator(mode="after")(validator)  # type: ignore[arg-type]

    data, lines = load_with_lines(STACK_YAML)
    with pytest.raises(ValidationError) as info:
        Stack.model_validate(data)
    return problems_from_validation(info.value, source="s.yaml", data=data, lines=lines, root=Stack)


def test_a_located_error_points_at_its_line_whatever_its_wording() -> None:
    def check(self: BaseModel) -> BaseModel:
        raise LocatedValueError("a size must be positive (got -1)", loc=("layers", 1, "size"))

    (problem,) = _problems(check)
    assert str(problem) == "s.yaml:6: layers[1].size: a size must be positive (got -1)"


def test_a_located_error_wins_over_a_place_named_in_its_message() -> None:
    def check(self: BaseModel) -> BaseModel:
        raise LocatedValueError("layers[0] and layers[2] are fine, this one is not", loc=("layers", 1))

    (problem,) = _problems(check)
    assert (problem.line, problem.field) == (5, "layers[1]")


def test_a_plain_value_error_falls_back_to_the_place_named_in_its_message() -> None:
    def check(self: BaseModel) -> BaseModel:
        raise ValueError("layers[1] has a negative size")

    (problem,) = _problems(check)
    assert (problem.line, problem.field) == (5, "layers[1]")


def test_a_plain_value_error_without_a_place_stays_on_the_model() -> None:
    def check(self: BaseModel) -> BaseModel:
        raise ValueError("the sizes do not add up")

    (problem,) = _problems(check)
    assert (problem.line, problem.field) == (1, "")


# ---------------------------------------------------------------------------
# documented


def _help(*command: str) -> str:
    return invoke(*command, "--help").stdout


def test_every_help_that_lists_exit_codes_lists_the_internal_error() -> None:
    listing = [c for c in ((), ("plan",), ("validate",), ("show",), ("diff",), ("spec",), ("schema",))
               if "Exit codes" in _help(*c)]
    assert len(listing) >= 5
    for command in listing:
        text = " ".join(_help(*command).split())
        assert f"{exit_codes.INTERNAL_ERROR} internal error" in text, command
    assert f"{exit_codes.BROKEN_PIPE} stdout closed early" in " ".join(_help().split())
    assert "--debug" in _help()


def test_the_readme_table_has_every_code() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Errors and exit codes")[1].split("\n## ")[0]
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", section, flags=re.M))
    assert set(rows) == {"0", "1", "2", str(exit_codes.INTERNAL_ERROR), str(exit_codes.BROKEN_PIPE),
                         str(exit_codes.INTERRUPTED)}
    assert "--debug" in section and exit_codes.DEBUG_ENV in section


def test_help_starts_without_pydantic_networkx_or_torch() -> None:
    code = ("import sys\nfrom planner.cli.app import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'networkx', 'pydantic') or "
            "(m.startswith('schemas.') and m != 'schemas.exit_codes')))")  # the package itself loads lazily
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_ctrl_c_exits_130_and_leaves_no_output_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt while the plan is written: exit 130, one line on stderr, the old -o file intact."""
    import planner.cli.output

    out = tmp_path / "plan.yaml"
    out.write_text("old\n")

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(planner.cli.output.os, "fsync", interrupted)
    result = invoke("plan", LLAMA, "-g", "12GB", "-o", str(out))
    assert result.exit_code == exit_codes.INTERRUPTED, result.output
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]
