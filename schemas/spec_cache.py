"""Validating each distinct param description of a spec once.

A large spec lists the same param (``q_proj.weight: [4096, 4096]``) in every layer. ParamSpec
validation depends only on its input and its result is frozen, so input with exactly the same
content (the same values of the same types, compared by ``content_key``) gives back the ParamSpec
validated the first time. Only successes are kept: input that fails is validated, and reported,
every time.
"""

from __future__ import annotations

from typing import Any

_SCALARS = frozenset((str, int, float, bool, type(None)))


def _frozen(value: Any) -> Any:
    """A hashable stand-in for a scalar or a list of scalars, keeping each value's type
    (so ``True`` and ``1``, or ``1`` and ``1.0``, never stand for each other); None otherwise."""
    cls = value.__class__
    if cls in _SCALARS:
        return cls, value
    if cls is list:
        types = tuple(map(type, value))
        if _SCALARS.issuperset(types):
            return list, tuple(value), types
    return None


def content_key(value: Any) -> Any:
    """A hashable key equal for exactly the inputs of the same content: a list of scalars, or a
    dict of str keys to scalars and lists of scalars; None for anything else (validated without
    the memo). Only the types YAML and JSON give (no tuples), which lax and strict validation,
    and Python and JSON mode, treat alike, so a result never depends on how it was validated."""
    cls = value.__class__
    if cls is list:
        return _frozen(value)
    if cls is dict:
        parts: list[Any] = [dict]
        for key, item in value.items():
            frozen = _frozen(item)
            if key.__class__ is not str or frozen is None:
                return None
            parts.append((key, frozen))
        return tuple(parts)
    return None


class Memo:
    """A bounded map of validated results: emptied when it grows past ``size`` entries, so a
    spec of many distinct params costs a lookup each and no unbounded memory."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.items: dict[Any, Any] = {}
        self.get = self.items.get  # the known result for a key, or None

    def put(self, key: Any, value: Any) -> None:
        if len(self.items) >= self.size:
            self.items.clear()
        self.items[key] = value
