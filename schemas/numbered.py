"""Names of the form ``<prefix>.<int>`` (``model.layers.7``): the shape of a block stack's layers."""

from __future__ import annotations

import re

NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def split_numbered(name: str) -> tuple[str, int] | None:
    """``('model.layers', 7)`` for ``'model.layers.7'``; None when the name does not end in ``.<int>``."""
    m = NUMBERED.match(name)
    return (m.group(1), int(m.group(2))) if m else None
