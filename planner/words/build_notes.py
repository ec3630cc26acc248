"""The budget and group strategies (and backend none) in words: a plan's backend_reason and first notes,
from their ``Choice`` (planner/strategy/choice.py) and, for strategy budget, its ladder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.strategy.budget import Ladder, Tier
from planner.strategy.choice import Choice
from planner.words.names import join_names
from schemas.sizes import format_bytes

NO_STACK = ("strategy group needs a block stack (layers named <prefix>.<int>, e.g. model.layers.{i} with repeat), "
            "and this spec has none")


def backends_text(backends: Mapping[str, str] | None, host: frozenset[str] = frozenset()) -> str:
    """The per-kind backends as a reason's prefix ('' without offload.backends); ``host``: the kinds the host
    CPU computes (offload.backends cpu, placed as uva)."""
    if not backends:
        return ""
    listed = ", ".join(f"{kind} {'cpu' if kind in host else backend}" for kind, backend in backends.items())
    return f"offload.backends: {listed}; other kinds "


def group_rule(group_size: int, num_in_group: int) -> str:
    return f"group rule: the last {num_in_group} of every {group_size} block-stack layers"


def reason(c: Choice, *, gpu_budget: int | None, total_bytes: int, backends: Mapping[str, str] | None,
           rule: str = "", host: frozenset[str] = frozenset()) -> str:
    """The plan's backend_reason (``rule``: the group rule's words, for strategy group; ``host``: the kinds
    the host CPU computes)."""
    if c.why == "backend_none":
        return "backend none requested: nothing is offloaded"
    if c.why == "group_empty":
        return f"{rule} selects no layer with eligible params: nothing is offloaded"
    if not c.offloads:
        if c.why == "no_budget":
            return "no gpu_budget given: nothing is offloaded"
        return f"the whole model ({format_bytes(total_bytes)}) fits the {format_bytes(gpu_budget or 0)} gpu_budget"
    prefix = backends_text(backends, host)
    if c.why == "requested":
        return f"{prefix}{c.backend} requested"
    if c.why == "prefetch_faster":
        return (f"{prefix}auto: prefetch predicts {c.step_ms or 0:.1f} ms a step against {c.other_ms or 0:.1f} ms "
                f"with UVA for the same params, with a {format_bytes(c.buffer_bytes)} buffer pool")
    if c.why == "uva_faster":
        return (f"{prefix}auto: UVA predicts {c.step_ms or 0:.1f} ms a step against {c.other_ms or 0:.1f} ms with "
                "prefetch for the same params, and needs no buffer pool")
    return (f"{prefix}auto: prefetching the same params would peak at {format_bytes(c.alternative or 0)}, over the "
            f"{format_bytes(gpu_budget or 0)} gpu_budget; UVA fits with no buffer pool")


def none_notes(c: Choice, *, gpu_budget: int | None, total_bytes: int) -> list[str]:
    if c.why == "backend_none":
        return ["backend none: every param stays on the GPU"]
    if c.why == "no_budget":
        return ["strategy budget without a gpu_budget: nothing offloaded (give --gpu-budget)"]
    if c.why == "fits":
        return [f"the whole model ({format_bytes(total_bytes)}) fits the {format_bytes(gpu_budget or 0)} gpu_budget: "
                "nothing offloaded"]
    return []


def group_notes(c: Choice, *, rule: str, selection: str, stack_len: int, names: Sequence[str]) -> list[str]:
    if not c.offloads:
        return []
    return [f"{rule}: offloaded {selection} of {len(c.chosen)} of {stack_len} layers "
            f"({join_names(names[p] for p in c.chosen)})"]


def budget_notes(c: Choice, ladder: Ladder, *, selection: str, gpu_budget: int, prefer: Sequence[str] | None,
                 names: Sequence[str]) -> list[str]:
    """What the ladder step taken offloads and why no fewer, then the preferred kinds that are missing."""
    t, n = ladder.state(c.count)
    tier = ladder.tiers[t]
    chosen = join_names(names[p] for p in tier.chosen(n))
    fewer = ""
    if c.fewer_peak is not None:
        peak = format_bytes(c.fewer_peak)
        fewer = f"; {n - 1} layers would peak at {peak}" if n > 1 or not tier.kinds else \
            f"; without {_label(tier, prefer)} it would peak at {peak}"
    budget = f"the fewest that fit the {format_bytes(gpu_budget)} gpu_budget (peak {format_bytes(c.peak)}{fewer})"
    if c.passed:
        them = "it" if c.passed == 1 else "them"
        budget = (f"the fewest that fit the {format_bytes(gpu_budget)} gpu_budget and that no plan offloading more "
                  f"beats at no higher peak (peak {format_bytes(c.peak)}; {c.passed} ladder step"
                  f"{'s' if c.passed > 1 else ''} with fewer params fit, but a plan offloading more predicts a faster "
                  f"step than {them})")
    if not tier.kinds:
        note = (f"budget: offloaded {selection} of {n} of {len(tier.members)} block-stack layers, spread evenly and "
                f"ending at the last one ({chosen}): {budget}")
    else:
        order = ", then ".join(_label(tr, prefer) for tr in ladder.tiers)
        done = [f"{_label(ladder.tiers[i], prefer)} of all {len(ladder.tiers[i].members)} block-stack layers holding it"
                for i in range(t)]
        this = (f"{_label(tier, prefer)} of {n} of the {len(tier.members)} block-stack layers holding it, spread "
                f"evenly and ending at the last one ({chosen})")
        note = f"budget by kind ({order}; among {selection}): offloaded {'; then '.join(done + [this])}: {budget}"
    out = [note]
    if ladder.missing:
        out.append(f"prefer: no eligible block-stack param is of kind {', '.join(ladder.missing)}; "
                   f"{'it was' if len(ladder.missing) == 1 else 'they were'} skipped")
    return out


def _label(tier: Tier, prefer: Sequence[str] | None) -> str:
    if len(tier.kinds) == 1 and tier.kinds[0] in (prefer or ()):
        return tier.kinds[0]
    return f"the other kinds ({', '.join(tier.kinds)})"
