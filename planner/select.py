"""Which block-stack layers to offload: eligibility, the group rule and the budget spread."""

from __future__ import annotations

from collections.abc import Sequence

from planner.kinds import param_kind
from schemas.spec import Layer, Tensor


def matches_segments(name: str, segment: str) -> bool:
    """True when ``segment`` occurs in the dotted ``name`` as a run of whole segments."""
    parts, want = name.split("."), segment.split(".")
    n = len(want)
    return any(parts[i:i + n] == want for i in range(len(parts) - n + 1))


def eligible_params(layer: Layer, segments: Sequence[str] | None, shared: set[str],
                    kinds: Sequence[str] | None = None) -> tuple[Tensor, ...]:
    """The layer's own params that may be offloaded (``shared``: params another param is tied to).

    A param must match one of ``segments`` and be of one of ``kinds``, each when given.
    """
    return tuple(
        t for t in layer.params
        if t.name not in shared and (segments is None or any(matches_segments(t.name, s) for s in segments))
        and (kinds is None or param_kind(layer.name, t.name, t.kind) in kinds)
    )


def group_rule(num_layers: int, group_size: int, num_in_group: int) -> list[int]:
    """vLLM's rule: stack index i is offloaded iff i % group_size >= group_size - num_in_group."""
    return [i for i in range(num_layers) if i % group_size >= group_size - num_in_group]


def spread(num_layers: int, n: int) -> list[int]:
    """n of num_layers indices spread evenly, the last one always included (Bresenham).

    Index i is chosen iff floor((i+1)*n/M) > floor(i*n/M), i.e. the j-th chosen index is
    ceil((j+1)*M/n) - 1.
    """
    return [-(-(j + 1) * num_layers // n) - 1 for j in range(n)]


def longest_run(positions: Sequence[int], num_layers: int) -> int:
    """Longest run of consecutive positions (sorted) among ``num_layers``, wrapping past the end."""
    if not positions:
        return 0
    if len(positions) >= num_layers:
        return num_layers
    best = run = 1
    for a, b in zip(positions, positions[1:]):
        run = run + 1 if b == a + 1 else 1
        best = max(best, run)
    if positions[0] == 0 and positions[-1] == num_layers - 1:
        first = 1
        while first < len(positions) and positions[first] == first:
            first += 1
        best = max(best, first + run)
    return best
