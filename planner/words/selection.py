"""The params a selection (offload.params, offload.kinds) may offload, in words."""

from __future__ import annotations

from collections.abc import Sequence


def params_desc(params: Sequence[str] | None, kinds: Sequence[str] | None) -> str:
    """The params a selection (offload.params, offload.kinds) may offload."""
    if params is None and kinds is None:
        return "all params"
    of_kind = "" if kinds is None else " of kind " + ", ".join(kinds)
    matching = "" if params is None else " matching " + ", ".join(params)
    return f"the params{of_kind}{matching}"
