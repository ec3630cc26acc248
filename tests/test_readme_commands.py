"""The README's `planner` commands do what the README says: each one that needs nothing this checkout lacks (a
GPU, a calibrated profile, a checkpoint, a shell pipe) runs, in README order, in one scratch folder, and ends
with the exit code its comment names (`# exit 1: ...`; 0 otherwise); a claim in its comment (`# backend: uva`)
or in the README's quoted output is in what it prints."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from cli_samples import invoke
from conftest import ROOT

README = (ROOT / "README.md").read_text()
NEEDS_MORE = ("my-gpu.yaml", "stats.json", "calibrate", "--from-safetensors", "--from-hf-config", "$(", ">>", "|",
              "--chart",  # matplotlib, an extra (tests/test_chart.py draws it)
              "--to vllm --format json")  # the text export's work again (seconds), in another format
# what the README quotes from a command's output, outside the command's own comment
QUOTED = {
    "planner diff vllm.plan.yaml auto.plan.yaml": "predicted step, decode (1 token) on h200: 71.872 ms -> 32.503 ms",
    "planner export vllm.plan.yaml --to vllm": "--offload-group-size 8 --offload-num-in-group 2 --offload-prefetch-step 1",
    "--tp 2 --gpu-budget 40GB -o mixtral-tp2/": "rank0.plan.yaml, rank1.plan.yaml",
    "--strategy group --group-size 4 --num-in-group 1": "strategy: group",
    # "How much memory a plan uses"
    "planner show serve.plan.yaml": "+ KV cache 16.00 GiB + activations 2.50 GiB + workspace 32.00 MiB",
    "-w decode=64@4096": "the KV cache for 64 x 4,096 tokens alone needs 32.00 GiB",
    "-w decode=1@4096 --kv-cache auto": "room for 14 sequences of 4,096 tokens",
    "planner show tps.plan.yaml": "batch 17 chosen for decode at 4,096 tokens: 292.7 tokens/s predicted",
}
CLAIM = re.compile(r"\bbackend: \w+")


def _commands() -> list[tuple[str, str]]:
    """(command, its comment) of every `planner` line of the README's sh blocks, and of the manifest heredoc
    (which `sh planner-plans.sh` runs), continuations joined."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            code, _, comment = line.partition("  #")
            if code.startswith("planner ") and not any(n in code for n in NEEDS_MORE):
                out.append((code.strip(), comment.strip()))
    return out


COMMANDS = _commands()


def test_the_readme_commands_are_found() -> None:
    assert len(COMMANDS) >= 30
    for quoted in QUOTED:
        assert any(quoted in command for command, _ in COMMANDS), quoted


def test_every_readme_command_does_what_the_readme_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "plans").mkdir()
    monkeypatch.chdir(tmp_path)
    manifest = re.search(r"cat > planner-plans.sh <<'END'\n(.*?)\nEND\n", README, re.S)
    assert manifest is not None
    (tmp_path / "planner-plans.sh").write_text(manifest.group(1) + "\n")
    for command, comment in COMMANDS:
        result = invoke(*shlex.split(command)[1:])
        code = re.search(r"\bexit (\d+)", comment)
        want = int(code.group(1)) if code else 0
        assert result.exit_code == want, f"{command}\n -> exit {result.exit_code}, the README says {want}:\n" \
                                         f"{result.output[-2000:]}"
        claims = CLAIM.findall(comment) + [text for key, text in QUOTED.items() if key in command]
        for claim in claims:
            assert claim in result.output, f"{command}: the README says {claim!r}; it printed:\n{result.output[:3000]}"


def test_the_quoted_refresh_line_is_what_check_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README, "Plans in review": the last line of `--check` when the committed plan was made with 12GB."""
    quoted = re.search(r"```text\n(llama-12GB\.plan\.yaml is out of date: .*?)\n```", README, re.S)
    assert quoted is not None
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    assert invoke("plan", "examples/llama-3-8b.yaml", "--gpu-budget", "12GB", "-o", "llama-12GB.plan.yaml").exit_code == 0
    result = invoke("plan", "examples/llama-3-8b.yaml", "--gpu-budget", "14GB", "--check", "llama-12GB.plan.yaml")
    assert result.exit_code == 1
    assert quoted.group(1) in result.output
