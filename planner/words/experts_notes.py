"""Routed experts split by expert, in words: what the host computes, which experts the GPU keeps, from which routing."""

from __future__ import annotations

from collections.abc import Sequence

from planner.words.names import join_names


def host_limits(layers: Sequence[str], limits: Sequence[int | None]) -> list[str]:
    """One note per distinct cpu_max_tokens of the layers whose host computes experts."""
    by_limit: dict[int | None, list[str]] = {}
    for name, limit in zip(layers, limits):
        by_limit.setdefault(limit, []).append(name)
    out = []
    for limit, names in by_limit.items():
        where = join_names(names, 8)
        if limit is None:
            out.append(f"cpu backend: the host computes the cpu experts of {where} at any number of tokens")
        else:
            out.append(f"cpu backend: the host computes the cpu experts of {where} in calls of up to {limit} tokens; "
                       "a larger call (a prefill) has the GPU read them through UVA, which is faster there")
    return out
