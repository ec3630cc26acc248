"""Runtime calls that must be refused before anything moves: offloaded buffers a model may write,
views of one storage that a plan counts twice, and views that no one of them covers.

Each case keeps the model it built; its ``after`` check proves every tensor, Parameter object and
storage is as it was (aliasing included).
"""

from __future__ import annotations

from pathlib import Path

import torch
from kv_model import make_kv_decoder
from model_state import differences, snapshot
from models import LlamaConfig, make_llama
from torch import nn

import planner
import runtime
from corpus.case import ApiCase
from runtime.errors import PlanMismatchError

_HELD: dict[Path, tuple[nn.Module, dict]] = {}


def _hold(tmp: Path, model: nn.Module) -> nn.Module:
    _HELD[tmp] = (model, snapshot(model))
    return model


def _unchanged(tmp: Path) -> None:
    model, snap = _HELD.pop(tmp)
    problems = differences(model, snap)
    assert not problems, "\n".join(problems)


def _group(model: nn.Module, backend: str = "prefetch"):
    return planner.plan(runtime.describe(model), strategy="group", group_size=2, num_in_group=1,
                        prefetch_step=1, backend=backend)


def _kv_cache(backend: str):
    def call(tmp: Path):
        model = _hold(tmp, make_kv_decoder())
        return runtime.apply(_group(model, backend), model, device="cpu")

    return call


def _shared_head(tmp: Path):
    """A plan made while the head had its own storage, applied once it views the embedding's."""
    model = make_llama(LlamaConfig(vocab=64, dim=32, layers=3, heads=4, kv_heads=2, hidden=48))
    plan = _group(model)
    model.lm_head.weight = nn.Parameter(model.model.embed_tokens.weight.data)  # another object, one storage
    return runtime.apply(plan, _hold(tmp, model), device="cpu")


def _transposed_head(tmp: Path):
    """The same with the head a transposed view (gpt-2's Conv1D-style heads): shapes differ too."""
    model = _TwoViews(transpose=True)
    plan = _group(_TwoViews(transpose=False))
    return runtime.apply(plan, _hold(tmp, model), device="cpu")


class _TwoViews(nn.Module):
    def __init__(self, transpose: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(16, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Module()
        w = self.embed.weight.data
        self.head.weight = nn.Parameter(w.t() if transpose else w.clone())


def _halves(tmp: Path):
    model = _TwoViews(transpose=False)
    fused = torch.randn(32, 16)
    model.layers[0].weight = nn.Parameter(fused[:16])
    model.layers[1].weight = nn.Parameter(fused[16:])
    return runtime.describe(_hold(tmp, model))


CASES: list[ApiCase] = [
    ApiCase("runtime-plan-offloads-a-kv-cache-prefetch", _kv_cache("prefetch"), PlanMismatchError,
            ("registered buffers", "layers.1.attention.kv_cache.k_cache", "read_only_buffers=True", "offload.params"),
            after=_unchanged),
    ApiCase("runtime-plan-offloads-a-kv-cache-uva", _kv_cache("uva"), PlanMismatchError,
            ("registered buffers", "v_cache"), after=_unchanged),
    ApiCase("runtime-plan-names-two-objects-of-one-storage", _shared_head, PlanMismatchError,
            ("'lm_head.weight' and 'model.embed_tokens.weight' are views of one storage", "tied"), after=_unchanged),
    ApiCase("runtime-plan-names-a-weight-and-its-transpose", _transposed_head, PlanMismatchError,
            ("'head.weight' and 'embed.weight' are views of one storage",), after=_unchanged),
    ApiCase("runtime-describe-views-no-one-covers", _halves, ValueError,
            ("'layers.0.weight' (bytes 0..1024)", "'layers.1.weight' (bytes 1024..2048)", "none of them covers"),
            after=_unchanged),
]
