"""Routed experts split by expert, in words: what the host computes, which experts the GPU keeps, from which routing."""

from __future__ import annotations

from collections.abc import Sequence

from planner.words.names import join_names


def host_limits(layers: Sequence[str], limits: Sequence[int | None], shares: Sequence[tuple[int, int]]) -> list[str]:
    """One note per distinct (host experts, experts) share and per distinct cpu_max_tokens of the layers whose
    experts the host and the link share."""
    out = []
    by_share: dict[tuple[int, int], list[str]] = {}
    for name, share in zip(layers, shares):
        by_share.setdefault(share, []).append(name)
    for (host, experts), names in by_share.items():
        where = join_names(names, 8)
        out.append(f"cpu backend: of the {experts} experts of {where}, the host computes {host} and GPU kernels read "
                   f"{experts - host} through UVA, at once: the split the cost model predicts fastest for the workload "
                   "(on a GPU each layer then moves it to the host's measured speed, runtime/host_guard.py; the "
                   "predictions are this split's, or, in a call of so few tokens that the host would take longer "
                   "than the GPU reading all of them, the guard's: every one through UVA)"
                   if host else f"cpu backend: the host computes none of the experts of {where}: reading them through "
                   "UVA is predicted faster for every expert at this workload")
    by_limit: dict[int | None, list[str]] = {}
    for name, limit, share in zip(layers, limits, shares):
        if share[0]:
            by_limit.setdefault(limit, []).append(name)
    for limit, names in by_limit.items():
        where = join_names(names, 8)
        if limit is None:
            out.append(f"cpu backend: the host computes the cpu experts of {where} at any number of tokens")
        else:
            out.append(f"cpu backend: the host computes the cpu experts of {where} in calls of up to {limit} tokens; "
                       "a larger call (a prefill) has the GPU read them through UVA, which is faster there")
    return out


def hot_note(layers: int, kept: int, nbytes: int, share: float) -> str:
    """What measured routing kept on the GPU."""
    from schemas.sizes import format_bytes

    if not kept:
        return (f"routing: the experts of {layers} MoE layers are split by expert; no GPU memory is left under the "
                "budget to keep the most used ones there")
    return (f"routing: then the experts of {layers} MoE layers are split by expert, and the {kept} most used stay on "
            f"the GPU ({format_bytes(nbytes)}, what the budget leaves); they receive {share:.1%} of the routed tokens "
            "recorded")


def thin_routing_note(where: str, layers: Sequence[str], fewest: float, least: int) -> str:
    """A routing recorded on too few tokens to estimate its experts' chances (schemas/routing.py)."""
    return (f"routing: {where} gave the experts of {join_names(list(layers), 8)} {fewest:.1f} choices an expert on "
            f"average at the fewest, under the {least} that estimate each expert's chance: read as chances, its "
            "unseen experts are never touched and the rest less often than they were, so the predictions under-count "
            "the experts a step touches and the experts kept on the GPU follow one sample; record more tokens "
            "(runtime.record_routing or Handle.routing_stats() over more steps)")
