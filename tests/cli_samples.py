"""Small inputs shared by the CLI tests: a valid spec text and hand-written plans."""

from __future__ import annotations

import copy
from typing import Any

from typer.testing import CliRunner

from planner.cli.app import app

TINY_SPEC = """\
model:
  name: tiny
  dtype: float16
  layers:
    - name: embed
      params:
        weight: [100, 8]
    - name: blocks.{i}
      repeat: 4
      params:
        mlp.w1: [32, 8]
        mlp.w2: [8, 32]
        norm.weight: [8]
    - name: head
      params:
        weight: [100, 8]
memory:
  gpu_budget: 2KB
  workspace: 0        # a toy model: its budgets are about weights, so nothing else is counted
  activations: 0
offload:
  backend: uva
"""


def _param(shape: list[int], dtype: str = "float16") -> dict[str, Any]:
    n = 1
    for d in shape:
        n *= d
    return {"shape": shape, "dtype": dtype, "bytes": n * 2}


def tiny_plan(offloaded_blocks: tuple[int, ...] = ()) -> dict[str, Any]:
    """A valid UVA plan of TINY_SPEC with the MLP weights of the given blocks in host memory."""
    layers = [{"name": "embed", "params": {"weight": _param([100, 8])},
               "resident_bytes": 1600, "offloaded_bytes": 0}]
    for i in range(4):
        off = ["mlp.w1", "mlp.w2"] if i in offloaded_blocks else []
        layers.append({
            "name": f"blocks.{i}",
            "params": {"mlp.w1": _param([32, 8]), "mlp.w2": _param([8, 32]), "norm.weight": _param([8])},
            "offloaded": off,
            "uva": off,  # a UVA plan: every offloaded param is read in place
            "resident_bytes": 1040 - 1024 * bool(off),
            "offloaded_bytes": 1024 if off else 0,
        })
    layers.append({"name": "head", "params": {"weight": _param([100, 8])},
                   "resident_bytes": 1600, "offloaded_bytes": 0})
    offloaded = sum(layer["offloaded_bytes"] for layer in layers)
    resident = sum(layer["resident_bytes"] for layer in layers)
    summary = {
        "model": "tiny", "backend": "uva", "backend_reason": "chosen in the test",
        "strategy": "budget", "gpu_budget_bytes": 8000, "total_bytes": resident + offloaded,
        "resident_bytes": resident, "offloaded_bytes": offloaded, "buffer_bytes": 0,
        "peak_gpu_bytes": resident, "pinned_host_bytes": offloaded, "layers": len(layers),
        "offloaded_layers": len(offloaded_blocks), "spec_sha256": "0" * 64,
    }
    return copy.deepcopy({"plan_version": 2, "summary": summary, "layers": layers})


def invoke(*args: str, stdin: str | None = None) -> Any:
    """Run the CLI in-process; the result has exit_code, stdout, stderr, output and exception."""
    return CliRunner().invoke(app, list(args), input=stdin)
