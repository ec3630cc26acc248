"""Names of the form ``<prefix>.<int>`` (``model.layers.7``): the shape of a block stack's layers."""

from __future__ import annotations

import re

NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def split_numbered(name: str) -> tuple[str, int] | None:
    """``('model.layers', 7)`` for ``'model.layers.7'``; None when the name does not end in ``.<int>``."""
    m = NUMBERED.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def runs(ints: list[int]) -> list[tuple[int, int]]:
    """The runs of consecutive ints in ``ints`` (as given, usually sorted): (first, last) each."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(ints):
        j = i
        while j + 1 < len(ints) and ints[j + 1] == ints[j] + 1:
            j += 1
        out.append((ints[i], ints[j]))
        i = j + 1
    return out
