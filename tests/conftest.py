"""Shared fixtures: the bundled examples and a small spec builder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from schemas import SpecFile, load_spec  # noqa: E402

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def llama8b() -> SpecFile:
    return weights_only(load_spec(EXAMPLES / "llama-3-8b.yaml"))


WEIGHTS_ONLY = {"workspace": 0, "activations": 0, "graphs": 0}  # a toy spec's budgets are about weights and buffers


def make_spec(blocks: list[dict[str, list[int]]], *, head: bool = True, offload: dict | None = None,
              memory: dict | None = None, dtype: str = "bfloat16") -> SpecFile:
    """A spec: optional ``embed`` layer, one ``model.layers.<i>`` per dict of params, optional ``norm``;
    its memory section counts no workspace and no activations (``WEIGHTS_ONLY``) unless ``memory`` says."""
    layers = [{"name": "embed", "params": {"weight": [64, 16]}}] if head else []
    layers += [{"name": f"model.layers.{i}", "params": params} for i, params in enumerate(blocks)]
    if head:
        layers.append({"name": "norm", "params": {"weight": [16]}})
    data = {"model": {"name": "toy", "dtype": dtype, "layers": layers}}
    if offload:
        data["offload"] = offload
    data["memory"] = {**WEIGHTS_ONLY, **(memory or {})}
    return SpecFile.model_validate(data)


def weights_only(spec: SpecFile) -> SpecFile:
    """``spec`` with a memory section that counts no workspace and no activations: for tests of how the
    strategies place weights at a budget (with no context, no KV cache is counted either), so that their
    budgets are the weights' and buffers' alone, as they were before plans counted the whole GPU."""
    return spec.model_copy(update={"memory": spec.memory.model_copy(update=WEIGHTS_ONLY)})


def plan_within(spec: SpecFile, budget: int):
    """The plan for ``budget``, or None when infeasible (after checking the reported minimum is exact)."""
    import planner
    from planner.errors import InfeasibleError

    try:
        return planner.plan(spec, gpu_budget=budget)
    except InfeasibleError as err:
        assert err.min_gpu_budget is not None and err.min_gpu_budget > budget
        again = planner.plan(spec, gpu_budget=err.min_gpu_budget)
        assert again.summary.peak_gpu_bytes == err.min_gpu_budget
        return None


def _hypothesis_profile() -> None:
    """CI runs every property test on the same derandomized examples, so a submission's result
    never depends on the draw; locally they explore new examples each run."""
    import os

    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None, deadline=None)
    if os.environ.get("CI"):
        settings.load_profile("ci")


_hypothesis_profile()
