"""Tokens per second as the objective: the batch of a decode step chosen with its plan (``batch: auto``).

A larger batch holds more KV cache, which leaves less of the budget to the weights, so more of them stream
over the host link and a step takes longer; a step's time otherwise grows little with the batch while the
weights stream. The predicted tokens per second, ``batch x 1000 / step_ms``, is what is maximized, each
batch with its own plan (the KV cache inside the budget):

1. the largest batch whose memory fits at all: the budget less the smallest the weights and buffers can
   be (read from the plan of a batch too large to fit), by bisection over the memory model alone;
2. batches spread over 1 ... that largest one (doubling, and the largest with its halves and quarters);
3. around the best so far, the batches halfway to its neighbours, until they are next to each other.

The plan of the best batch is returned with the ``throughput`` section: the batch, its tokens per second,
and the batches tried nearest to it.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.errors import InfeasibleError
from schemas.plan import Plan
from schemas.throughput import BatchOption, Throughput
from schemas.workload import MAX_TOKENS, Workload

NEIGHBOURS = 2  # batches tried on each side of the chosen one that the plan records
REFINE = 8  # at most this many halving steps around the best batch


def plan_throughput(make: Callable[[Workload], Plan], workload: Workload) -> Plan:
    """The plan of the batch with the most predicted tokens per second (``make``: the plan of a workload
    whose batches are all given; it raises InfeasibleError when one does not fit)."""
    name = workload.auto
    assert name is not None
    context = workload.root[name].context
    assert context is not None
    tried: dict[int, tuple[Plan, float] | None] = {}

    def at(batch: int) -> float | None:
        """Predicted tokens per second at ``batch`` (None: it does not fit)."""
        if batch not in tried:
            try:
                made = make(workload.with_batch(name, batch))
            except InfeasibleError:
                tried[batch] = None
            else:
                tried[batch] = (made, _tokens_per_s(made, name, batch))
        found = tried[batch]
        return None if found is None else found[1]

    try:
        make(workload.with_batch(name, 1))
    except InfeasibleError as err:
        raise InfeasibleError(f"batch auto: not even one sequence of {context:,} tokens fits: {err.message}",
                              err.min_gpu_budget) from None
    largest = _largest(at)
    for batch in _spread(largest):
        at(batch)
    best = _best(tried)
    for _ in range(REFINE):
        fits = sorted(b for b, v in tried.items() if v is not None)
        i = fits.index(best)
        mids = {(fits[j] + best) // 2 for j in (i - 1, i + 1) if 0 <= j < len(fits)} - set(tried)
        if not mids:
            break
        for batch in mids:
            at(batch)
        best = _best(tried)
    chosen, tps = tried[best]  # type: ignore[misc]
    fits = sorted(b for b, v in tried.items() if v is not None)
    i = fits.index(best)
    near = fits[max(0, i - NEIGHBOURS): i + NEIGHBOURS + 1]
    options = [BatchOption(batch=b, step_ms=_step(tried[b][0], name), tokens_per_s=round(tried[b][1], 2))  # type: ignore[index]
               for b in near]
    section = Throughput(workload=name, context=context, batch=best, tokens_per_s=round(tps, 2), tried=len(tried),
                         options=options)
    return chosen.model_copy(update={"throughput": section})


def _largest(at: Callable[[int], float | None]) -> int:
    """The largest batch that fits, by doubling then bisection (the plans made on the way are kept)."""
    lo, hi = 1, 2
    while hi <= MAX_TOKENS and at(hi) is not None:
        lo, hi = hi, hi * 2
    hi = min(hi, MAX_TOKENS + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid) is None:
            hi = mid
        else:
            lo = mid
    return lo


def _spread(largest: int) -> list[int]:
    """Batches over 1 ... largest: its halves, quarters and three quarters (the doubling tried the powers)."""
    return sorted({max(1, largest * k // 4) for k in (1, 2, 3)})


def _best(tried: dict[int, tuple[Plan, float] | None]) -> int:
    """The batch with the most tokens per second (the smaller batch on a tie: less memory, same rate)."""
    return max((b for b, v in tried.items() if v is not None), key=lambda b: (tried[b][1], -b))  # type: ignore[index]


def _step(plan: Plan, name: str) -> float:
    assert plan.predictions is not None
    return next(r.step_ms for r in plan.predictions.workloads if r.workload == name)


def _tokens_per_s(plan: Plan, name: str, batch: int) -> float:
    step = _step(plan, name)
    return batch * 1000.0 / step if step > 0 else 0.0
