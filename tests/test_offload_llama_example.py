"""examples/offload_llama.py runs end to end on the CPU (--small) and reports PASS (in-process)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "offload_llama.py"


def run_script(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str]]:
    spec = importlib.util.spec_from_file_location("offload_llama", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code = module.main(list(args))
    return code, capsys.readouterr().out.splitlines()


def test_small_cpu_run_passes_with_both_backends(capsys: pytest.CaptureFixture) -> None:
    code, lines = run_script(capsys, "--small", "--device", "cpu", "--tokens", "6")
    assert code == 0 and lines[-1] == "PASS", lines
    want = next(line for line in lines if line.startswith("no offload: "))[len("no offload: "):]
    for backend in ("prefetch", "uva"):
        got = [line for line in lines if line.startswith(f"{backend}: [")]
        assert len(got) == 1 and got[0].startswith(f"{backend}: {want} ") and "identical" in got[0], lines
        assert any(line.startswith(f"{backend}: budget") and "layers offloaded" in line for line in lines)
        speed = [line for line in lines if line.startswith(f"{backend}: ") and "tokens/s measured" in line]
        assert len(speed) == 1 and "predicted for h200 in eager mode" in speed[0], lines  # no CUDA graphs on the CPU


def test_infeasible_budget_fails_cleanly(capsys: pytest.CaptureFixture) -> None:
    code, lines = run_script(capsys, "--small", "--device", "cpu", "--tokens", "2", "--budget-fraction", "0.01",
                             "--backend", "uva")
    assert code == 1 and lines[-1] == "FAIL" and "gpu_budget" in lines[-2], lines
