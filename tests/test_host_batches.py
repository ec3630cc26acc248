"""The host's padded pass groups touched experts into batches (``runtime.expert_math._runs``): runs of consecutive
touched experts, joined across gaps while a batch's untouched experts stay at most ``JOIN_WASTE`` of its touched
ones. The grouping may change how many bytes the host reads, never the rows it computes."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moe_models import ARCHITECTURES, make_moe, random_call  # noqa: E402
from runtime import expert_math  # noqa: E402
from runtime.expert_math import Layout, _runs, host_rows, is_experts_module, rows_dtype  # noqa: E402


def _plain_runs(counts: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for e, c in enumerate(counts):
        if c:
            out = out[:-1] + [(out[-1][0], e + 1)] if out and out[-1][1] == e else out + [(e, e + 1)]
    return out


@pytest.mark.parametrize("seed", range(200))
def test_batches_cover_each_touched_expert_once_and_keep_the_waste_bound(seed):
    rng = random.Random(seed)
    density = rng.choice((0.1, 0.5, 0.8, 0.95))
    counts = [rng.randint(1, 3) if rng.random() < density else 0 for _ in range(rng.randint(0, 64))]
    waste = rng.choice((0.0, 0.125, 0.5, 10.0))
    batches = _runs(counts, waste)
    assert _runs(counts, 0.0) == _plain_runs(counts)
    covered = [e for s, e in batches for e in range(s, e)]
    assert covered == sorted(set(covered))  # disjoint, in order
    assert {e for e, c in enumerate(counts) if c} <= set(covered)
    for s, e in batches:
        assert counts[s] and counts[e - 1]  # a batch starts and ends on a touched expert
        touched = sum(1 for c in counts[s:e] if c)
        assert (e - s) - touched <= waste * touched + 1e-9
    assert len(batches) <= len(_plain_runs(counts))


def test_a_gap_is_joined_only_when_enough_experts_are_touched_around_it():
    assert _runs([1] * 8 + [0] + [1]) == [(0, 10)]  # 9 touched, 1 untouched: within an eighth
    assert _runs([1] * 3 + [0] + [1]) == [(0, 3), (4, 5)]
    assert _runs([1, 0, 0, 1], 1.0) == [(0, 4)]  # 2 untouched for 2 touched: at the bound, joined
    assert _runs([1, 0, 0, 1], 0.99) == [(0, 1), (3, 4)]


def _host_call(arch: str, tokens: int, seed: int):
    """A call of ``host_rows`` over every expert of one of ``arch``'s layers at ``tokens`` random tokens: its rows."""
    model = make_moe(arch)
    experts = next(m for m in model.modules() if is_experts_module(m))
    layout = Layout.of(experts)
    weights = {name: getattr(experts, name).detach() for name in layout.names}
    n = weights["down_proj"].shape[0]
    hidden, index, topw = random_call(model.config, n, tokens, seed)
    k = model.config.num_experts_per_tok

    def call() -> torch.Tensor:
        out = torch.zeros(tokens * k, model.config.hidden_size, dtype=rows_dtype(hidden, topw))
        assert host_rows(experts, layout, weights, torch.arange(n), hidden, index, topw, out)
        return out

    return call


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("tokens", (1, 8, 32))
def test_joining_never_changes_the_host_rows(arch, tokens, monkeypatch):
    host_call = _host_call(arch, tokens, seed=tokens)

    def rows(waste: float) -> torch.Tensor:
        monkeypatch.setattr(expert_math, "JOIN_WASTE", waste)
        return host_call()

    apart = rows(0.0)
    assert apart.abs().sum() > 0
    for waste in (0.125, 1.0, 1e9):
        assert torch.equal(rows(waste), apart)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("tokens", (1, 8, 32))
def test_padding_rows_to_a_multiple_never_changes_the_host_rows(arch, tokens, monkeypatch):
    """``PAD_ROWS`` adds zero rows to every touched expert's batch: the rows taken back are the same."""
    host_call = _host_call(arch, tokens, seed=100 + tokens)

    def rows(pad: int) -> torch.Tensor:
        monkeypatch.setattr(expert_math, "PAD_ROWS", pad)
        return host_call()

    plain = rows(1)
    assert plain.abs().sum() > 0
    for pad in (3, 16):
        assert torch.equal(rows(pad), plain)
