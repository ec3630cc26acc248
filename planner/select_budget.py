"""The budget strategy's search: the fewest evenly spread stack layers whose plan fits the budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.cost import Candidate, Cost, evaluate
from planner.select import spread


@dataclass(frozen=True)
class Search:
    backend: str
    fit: Cost | None  # the plan with the fewest offloaded layers that fits, or None
    lowest: Cost  # the lowest peak seen (over every n when nothing fits) within the cpu budget


def search(
    candidates: Sequence[Candidate],
    *,
    total_bytes: int,
    num_layers: int,
    backend: str,
    step: int | None,
    gpu_budget: int,
    cpu_budget: int | None,
) -> Search:
    """Try n = 0, 1, ... offloaded layers (``spread`` over the candidates) and stop at the first fit.

    The n whose resident bytes alone exceed the budget whatever layers are picked are skipped.

    A plan fits when its peak is within ``gpu_budget`` and its pinned bytes within ``cpu_budget``.
    """
    m = len(candidates)
    common = dict(total_bytes=total_bytes, num_layers=num_layers, backend=backend, step=step)
    lowest: Cost | None = None
    first = _fewest_possible(candidates, total_bytes, gpu_budget)
    for n in range(first, m + 1):
        cost = evaluate(candidates, spread(m, n), **common)
        if cpu_budget is not None and cost.offloaded_bytes > cpu_budget:
            continue
        lowest = cost if lowest is None or cost.peak_gpu_bytes < lowest.peak_gpu_bytes else lowest
        if cost.peak_gpu_bytes <= gpu_budget:
            return Search(backend, cost, lowest)
    for n in range(first):  # nothing fits: the lowest peak over every n, for the error message
        cost = evaluate(candidates, spread(m, n), **common)
        if cpu_budget is None or cost.offloaded_bytes <= cpu_budget:
            lowest = cost if lowest is None or cost.peak_gpu_bytes < lowest.peak_gpu_bytes else lowest
    assert lowest is not None  # n = 0 pins nothing
    return Search(backend, None, lowest)


def _fewest_possible(candidates: Sequence[Candidate], total_bytes: int, gpu_budget: int) -> int:
    """A lower bound on n: even the n largest candidates leave more than the budget resident below it."""
    resident = total_bytes
    for n, nbytes in enumerate(sorted((c.nbytes for c in candidates), reverse=True)):
        if resident <= gpu_budget:
            return n
        resident -= nbytes
    return len(candidates)
