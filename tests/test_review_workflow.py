"""Plans in review: the pre-commit hook (.pre-commit-hooks.yaml, `planner check-plans`) and the
example pull-request workflow (examples/review/), run with the same command lines against a
temporary git repository whose spec changes between two commits.

`planner` on PATH is this checkout's CLI (a small shim), so the hook's entry and the workflow's
script run exactly as written in those files."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from corpus.lockfile import SPEC

HOOKS = ROOT / ".pre-commit-hooks.yaml"
WORKFLOW = ROOT / "examples" / "review" / "plan-review.yml"
PLAN_DIFF = ROOT / "examples" / "review" / "plan-diff.sh"
PLAN = "plans/tiny.plan.yaml"
MANIFEST = f"# the command that makes each committed plan\nplanner plan spec.yaml -o {PLAN}\n"
SMALLER = SPEC.replace("gpu_budget: 8KB", "gpu_budget: 4KB")  # another plan: more of the model on the host

needs_git = pytest.mark.skipif(shutil.which("git") is None or shutil.which("sh") is None,
                               reason="needs git and sh")


def _hook() -> dict:
    (hook,) = yaml.safe_load(HOOKS.read_text())
    return hook


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    """The environment with this checkout's `planner` first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "planner"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c 'from planner.cli.app import main; main()' \"$@\"\n")
    shim.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PATH": path, "PYTHONPATH": python_path, "GIT_CONFIG_NOSYSTEM": "1"}


@pytest.fixture()
def repo(tmp_path: Path, env: dict[str, str]) -> Path:
    """A git repository with one commit (the base): spec.yaml, planner-plans.sh and the plan it makes."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "plans").mkdir()
    (root / "spec.yaml").write_text(SPEC)
    (root / "planner-plans.sh").write_text(MANIFEST)
    for args in (["git", "init", "-q"], ["git", "config", "user.name", "Test"],
                 ["git", "config", "user.email", "test@example.com"], ["git", "config", "commit.gpgsign", "false"],
                 ["sh", "planner-plans.sh"], ["git", "add", "-A"], ["git", "commit", "-qm", "base"]):
        done = _run(args, root, env)
        assert done.returncode == 0, (args, done.stderr)
    return root


def _commit(root: Path, env: dict[str, str], message: str) -> None:
    for args in (["git", "add", "-A"], ["git", "commit", "-qm", message]):
        done = _run(args, root, env)
        assert done.returncode == 0, (args, done.stderr)


def _hook_run(root: Path, env: dict[str, str], *files: str) -> subprocess.CompletedProcess[str]:
    """What pre-commit runs: the hook's entry with the changed files that match its pattern."""
    hook = _hook()
    matching = [f for f in files if re.search(hook["files"], f)]
    return _run([*shlex.split(hook["entry"]), *matching], root, env)


# ---------------------------------------------------------------------------
# the files themselves


def test_hook_entry_is_the_planner_check_plans_command() -> None:
    hook = _hook()
    assert hook["id"] and hook["name"] and hook["language"] == "python"
    program, command = shlex.split(hook["entry"])
    scripts = re.search(r"\[project\.scripts\]\n(.*?)\n\n", (ROOT / "pyproject.toml").read_text(), re.S)
    assert scripts and f'{program} = "planner.cli.app:main"' in scripts.group(1)
    from planner.cli.app import app, main

    from typer.main import get_command

    assert command in get_command(app).commands  # type: ignore[attr-defined]
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0


@pytest.mark.parametrize(("path", "matches"), [
    ("spec.yaml", True), ("models/llama.yml", True), ("plans/llama.plan.json", True),
    ("planner-plans.sh", True), ("sub/planner-plans.sh", True),
    ("README.md", False), ("tools/make-planner-plans.sh", False), ("setup.py", False),
])
def test_hook_pattern_passes_specs_plans_and_the_manifest(path: str, matches: bool) -> None:
    assert bool(re.search(_hook()["files"], path)) is matches


def test_workflow_runs_the_script_and_the_check() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers
    assert workflow["permissions"]["pull-requests"] == "write"
    (job,) = workflow["jobs"].values()
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "examples/review/plan-diff.sh" in runs
    assert "gh pr comment" in runs and "--body-file plan-diff.md" in runs
    assert "planner check-plans" in runs
    assert any(step.get("uses", "").startswith("actions/checkout") and step["with"]["fetch-depth"] == 0
               for step in job["steps"])
    assert PLAN_DIFF.is_file() and os.access(PLAN_DIFF, os.X_OK)


# ---------------------------------------------------------------------------
# the hook


@needs_git
def test_hook_passes_when_the_committed_plan_is_current(repo: Path, env: dict[str, str]) -> None:
    done = _hook_run(repo, env, "spec.yaml", PLAN, "planner-plans.sh")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{PLAN} is up to date" in done.stdout
    assert "1 plan checked: 1 up to date" in done.stdout


@needs_git
def test_hook_fails_when_the_spec_changed_and_the_plan_did_not(repo: Path, env: dict[str, str]) -> None:
    (repo / "spec.yaml").write_text(SMALLER)
    _commit(repo, env, "a smaller budget, plan not made again")
    done = _hook_run(repo, env, "spec.yaml")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "plan diff: moved" in done.stdout and "gpu_budget_bytes" in done.stdout
    assert f"{PLAN} was made from another spec" in done.stdout
    assert f"refresh with: planner plan spec.yaml -o {PLAN}" in done.stdout
    # refreshing as the message says makes the hook pass
    assert _run(["sh", "planner-plans.sh"], repo, env).returncode == 0
    assert _hook_run(repo, env, "spec.yaml", PLAN).returncode == 0


@needs_git
def test_hook_checks_only_the_plans_the_changed_files_concern(repo: Path, env: dict[str, str]) -> None:
    (repo / "other.yaml").write_text(SMALLER)
    (repo / "planner-plans.sh").write_text(MANIFEST + "planner plan other.yaml --backend uva -o plans/other.plan.yaml\n")
    assert _run(["sh", "planner-plans.sh"], repo, env).returncode == 0
    (repo / "other.yaml").write_text(SPEC)  # other.plan.yaml is now out of date, tiny.plan.yaml is not
    (repo / ".pre-commit-config.yaml").write_text("repos: []\n")  # neither spec nor plan: not checked
    only_tiny = _hook_run(repo, env, "spec.yaml", ".pre-commit-config.yaml")
    assert only_tiny.returncode == 0, only_tiny.stdout + only_tiny.stderr
    assert "other.plan.yaml" not in only_tiny.stdout and "1 plan checked" in only_tiny.stdout
    assert "not checked, no line of planner-plans.sh names them: .pre-commit-config.yaml" in only_tiny.stdout
    other = _hook_run(repo, env, "other.yaml")
    assert other.returncode == 1 and "plans/other.plan.yaml was made from another spec" in other.stdout
    every = _hook_run(repo, env, "planner-plans.sh")  # the manifest changed: every line is checked
    assert every.returncode == 1 and "2 plans checked: 1 up to date, 1 out of date" in every.stdout


# ---------------------------------------------------------------------------
# the workflow's script


@needs_git
def test_plan_diff_script_reports_the_base_plan_against_the_head_plan(repo: Path, env: dict[str, str]) -> None:
    base = _run(["git", "rev-parse", "HEAD"], repo, env).stdout.strip()
    (repo / "spec.yaml").write_text(SMALLER)  # the plan is not made again: the script makes it from HEAD
    _commit(repo, env, "a smaller budget")
    done = _run(["sh", str(PLAN_DIFF), base, "HEAD"], repo, env)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith(f"## Offload plans: `{base}` → `HEAD`")
    assert f"### `{PLAN}`" in text and "## Plan diff" not in text  # its title is the plan's
    assert "| gpu_budget_bytes | 7.81 KiB (8000) | 3.91 KiB (4000) |" in text
    assert "#### Moved" in text and "| GPU | host (uva) |" in text
    # the same as `planner diff --format markdown` between the two commits' plans, made again
    committed = _run(["git", "show", f"{base}:{PLAN}"], repo, env).stdout
    (repo / "old.plan.yaml").write_text(committed)
    assert _run(["sh", "planner-plans.sh"], repo, env).returncode == 0
    direct = _run(["planner", "diff", "old.plan.yaml", PLAN, "--format", "markdown"], repo, env)
    assert direct.returncode == 1
    assert direct.stdout.split("\n", 1)[1].replace("\n#", "\n##") in text
    # the working tree and the list of worktrees are as they were
    assert _run(["git", "worktree", "list"], repo, env).stdout.count("\n") == 1


@needs_git
def test_plan_diff_script_names_unchanged_and_new_plans(repo: Path, env: dict[str, str]) -> None:
    (repo / "planner-plans.sh").write_text(MANIFEST + "planner plan spec.yaml --backend uva -o plans/uva.plan.yaml\n")
    assert _run(["sh", "planner-plans.sh"], repo, env).returncode == 0
    _commit(repo, env, "a second plan")
    done = _run(["sh", str(PLAN_DIFF), "HEAD~1"], repo, env)
    assert done.returncode == 0, done.stderr
    assert f"Unchanged: `{PLAN}`" in done.stdout
    assert "### `plans/uva.plan.yaml`\n\nA new plan (not in `HEAD~1`)." in done.stdout
    assert _run(["git", "status", "--porcelain"], repo, env).stdout == ""


@needs_git
def test_plan_diff_script_refuses_an_unknown_base(repo: Path, env: dict[str, str]) -> None:
    done = _run(["sh", str(PLAN_DIFF), "no-such-branch"], repo, env)
    assert done.returncode == 2 and "no commit no-such-branch" in done.stderr


# ---------------------------------------------------------------------------
# the manifest as check-plans reads it (in-process)


def _manifest_dir(tmp_path: Path, manifest: str) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "spec.yaml").write_text(SPEC)
    (folder / "planner-plans.sh").write_text(manifest)
    return folder


def test_manifest_paths_are_relative_to_its_folder_and_sh_agrees(tmp_path: Path, env: dict[str, str]) -> None:
    from cli_samples import invoke

    manifest = ("# plans of the tiny model\n"
                "planner plan spec.yaml -o 'tiny plan.yaml'   # a trailing comment\n"
                "planner plan spec.yaml \\\n    --backend uva --format json \\\n    -o tiny.plan.json\n")
    folder = _manifest_dir(tmp_path, manifest)
    assert _run(["sh", "-e", "planner-plans.sh"], folder, env).returncode == 0  # sh reads the same two commands
    listed = invoke("check-plans", "--manifest", f"{folder}/planner-plans.sh", "--list")
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines() == [f"{folder}/tiny plan.yaml", f"{folder}/tiny.plan.json"]
    checked = invoke("check-plans", "--manifest", f"{folder}/planner-plans.sh")
    assert checked.exit_code == 0, checked.output
    assert "2 plans checked: 2 up to date" in checked.stdout
    (folder / "spec.yaml").write_text(SMALLER)
    stale = invoke("check-plans", "--manifest", f"{folder}/planner-plans.sh", f"{folder}/tiny.plan.json",
                   "--diff-format", "markdown")
    assert stale.exit_code == 1
    assert "## Plan diff" in stale.stdout and "1 plan checked: 1 out of date" in stale.stdout
    assert f"--format json --backend uva -o {folder}/tiny.plan.json\n```" in stale.stdout  # the refresh command
    assert f"cd {folder} && sh planner-plans.sh" in stale.stdout


def test_a_changed_hardware_file_selects_its_plans(tmp_path: Path, env: dict[str, str]) -> None:
    from cli_samples import invoke

    from schemas.hardware import PROFILES

    folder = _manifest_dir(tmp_path, "planner plan spec.yaml -o a.plan.yaml\n"
                                     "planner plan spec.yaml --hardware gpu.yaml -o b.plan.yaml\n")
    (folder / "gpu.yaml").write_text((PROFILES / "h200.yaml").read_text())
    assert _run(["sh", "-e", "planner-plans.sh"], folder, env).returncode == 0
    listed = invoke("check-plans", "--manifest", f"{folder}/planner-plans.sh", "--list", f"{folder}/gpu.yaml")
    assert listed.exit_code == 0 and listed.stdout == f"{folder}/b.plan.yaml\n"


def test_a_plan_listed_but_not_made_yet_is_out_of_date(tmp_path: Path) -> None:
    from cli_samples import invoke

    folder = _manifest_dir(tmp_path, "planner plan spec.yaml --gpu-budget 6KB -o new.plan.yaml\n")
    done = invoke("check-plans", "--manifest", f"{folder}/planner-plans.sh")
    assert done.exit_code == 1
    assert (f"{folder}/new.plan.yaml does not exist; make it with: planner plan {folder}/spec.yaml "
            f"--gpu-budget 6KB -o {folder}/new.plan.yaml") in done.stdout
    assert not (folder / "new.plan.yaml").exists()


def test_a_line_that_no_longer_fits_its_budget_fails_with_its_line(tmp_path: Path, env: dict[str, str]) -> None:
    from cli_samples import invoke

    folder = _manifest_dir(tmp_path, "planner plan spec.yaml --gpu-budget 6KB --backend prefetch -o p.plan.yaml\n")
    assert _run(["sh", "-e", "planner-plans.sh"], folder, env).returncode == 0
    (folder / "spec.yaml").write_text(SPEC.replace("[100, 8]", "[400, 8]"))  # bigger resident layers
    done = invoke("check-plans", "--manifest", f"{folder}/planner-plans.sh")
    assert done.exit_code == 1, done.output
    assert "the smallest feasible" in done.stderr and "planner-plans.sh line 1" in done.stderr
    assert "1 plan checked: 1 failed" in done.stdout


@needs_git
def test_plan_diff_script_compares_a_rank_set_rank_by_rank(repo: Path, env: dict[str, str]) -> None:
    """A `--tp N` line writes a folder of rank plans: the script compares it with BASE's folder rank by rank."""
    from cli_samples import TINY_SPEC

    (repo / "tp.yaml").write_text(TINY_SPEC)
    line = "planner plan tp.yaml --tp 2 --backend uva -g {} -o plans/tp2/\n"
    (repo / "planner-plans.sh").write_text(MANIFEST + line.format("2MB"))
    assert _run(["sh", "planner-plans.sh"], repo, env).returncode == 0
    _commit(repo, env, "a rank set")
    (repo / "planner-plans.sh").write_text(MANIFEST + line.format("400KB"))
    _commit(repo, env, "a smaller budget per rank")
    done = _run(["sh", str(PLAN_DIFF), "HEAD~1"], repo, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "### `plans/tp2`" in done.stdout and "Not compared" not in done.stdout
    assert "rank 0" in done.stdout and "rank 1" in done.stdout
    assert f"Unchanged: `{PLAN}`" in done.stdout
    assert _run(["git", "status", "--porcelain"], repo, env).stdout == ""


def test_each_line_is_checked_as_plan_check_says_without_running_the_command(tmp_path: Path, env: dict[str, str],
                                                                              monkeypatch) -> None:
    """check-plans calls the planner's functions (planner/cli/plan_command.py) for each line: the same verdict,
    diff, error and exit code as `planner plan ... --check PLAN`, with the plan command itself never run."""
    from cli_samples import invoke
    from typer.main import get_command

    from planner.cli.app import app

    folder = _manifest_dir(tmp_path, "planner plan spec.yaml -o ok.plan.yaml\n"
                                     "planner plan spec.yaml --gpu-budget 6KB --backend prefetch -o tight.plan.yaml\n")
    (folder / "other.yaml").write_text(SMALLER)
    assert _run(["sh", "-e", "planner-plans.sh"], folder, env).returncode == 0
    (folder / "spec.yaml").write_text(SPEC.replace("[100, 8]", "[400, 8]"))  # line 1 out of date, line 2 infeasible
    direct = [invoke("plan", f"{folder}/spec.yaml", *options, "--check", f"{folder}/{plan}")
              for options, plan in (((), "ok.plan.yaml"), (("--gpu-budget", "6KB", "--backend", "prefetch"),
                                                           "tight.plan.yaml"))]
    command_class = type(get_command(app).get_command(None, "plan"))  # type: ignore[union-attr]
    run_command = command_class.invoke

    def refuse_plan(command, ctx):
        assert command.name != "plan", "the plan command was run"
        return run_command(command, ctx)

    monkeypatch.setattr(command_class, "invoke", refuse_plan)
    done = invoke("check-plans", "--manifest", f"{folder}/planner-plans.sh")
    assert [d.exit_code for d in direct] == [1, 1] and done.exit_code == 1
    assert done.stdout.startswith(direct[0].stdout + "\n" + direct[1].stdout)  # the verdicts, as plan --check prints
    assert "1 out of date, 1 failed" in done.stdout
    assert done.stderr == direct[1].stderr + f"hint: {folder}/planner-plans.sh line 2: planner plan " \
                                             f"{folder}/spec.yaml --gpu-budget 6KB --backend prefetch -o " \
                                             f"{folder}/tight.plan.yaml\n"
