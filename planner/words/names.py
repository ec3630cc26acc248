"""Compact, exact spellings of layer-name lists for notes and diffs: ``model.layers.{0..3,7}``."""

from __future__ import annotations

from collections.abc import Iterable

from schemas.numbered import NUMBERED as _NUMBERED
from schemas.numbered import runs


def _ranges(ints: list[int]) -> str:
    parts: list[str] = []
    for a, b in runs(ints):
        parts += [f"{a}..{b}"] if b - a >= 2 else [str(x) for x in range(a, b + 1)]
    return ",".join(parts)


def compress_names(names: Iterable[str]) -> list[str]:
    """Group ``<prefix>.<int>`` names sharing a prefix into ``prefix.{a,b..c}`` (order of first sight).

    Exact: ``{a..c}`` means every int from a to c; other names are kept as they are.
    """
    groups: dict[str, list[int]] = {}
    order: list[tuple[str, str]] = []  # ("n", prefix) or ("s", name)
    for name in names:
        m = _NUMBERED.match(name)
        if m and (m.group(2) == "0" or not m.group(2).startswith("0")):  # "03" would not round-trip
            prefix = m.group(1)
            if prefix not in groups:
                groups[prefix] = []
                order.append(("n", prefix))
            groups[prefix].append(int(m.group(2)))
        else:
            order.append(("s", name))
    out = []
    for kind, value in order:
        if kind == "s":
            out.append(value)
        elif len(groups[value]) == 1:
            out.append(f"{value}.{groups[value][0]}")
        else:
            out.append(f"{value}.{{{_ranges(sorted(set(groups[value])))}}}")
    return out


def join_names(names: Iterable[str], limit: int | None = None) -> str:
    parts = compress_names(names)
    if limit is not None and len(parts) > limit:
        return ", ".join(parts[:limit]) + f" and {len(parts) - limit} more"
    return ", ".join(parts)
