"""Names in a spec (the model, layers, params, tie targets, name segments): printable, in one
Unicode spelling, and, for dotted names, without empty segments or surrounding spaces. The same
rule holds for every name and text another file gives that a command prints: ``PrintableName``
(a hardware profile's name, the names in a plan) and ``PrintableText`` (a profile's source).

Control characters, escape sequences, bidi overrides, zero-width and other invisible
characters (Unicode categories C* and Z* but the ASCII space) are refused, so a name prints
as what it is; messages show a refused name with ``repr``, which escapes them.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from typing import Annotated

from pydantic import AfterValidator, Field

_MAX_PASSED = 65536
_passed: set[str] = set()  # names check_dotted_name accepted (it depends on the name alone)


def _describe(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"the character U+{ord(ch):04X}{f' ({name})' if name else ''}"


def check_printable(value: str, what: str) -> str:
    """``value`` if every character prints and it is in NFC form; else ValueError naming the problem."""
    if value.isascii() and value.isprintable():
        return value  # the common case
    if not value.isprintable():
        bad = next(ch for ch in value if not ch.isprintable())
        raise ValueError(f"{what} {value!r} holds {_describe(bad)}, a control, format or invisible "
                         "character; names must be printable")
    if not unicodedata.is_normalized("NFC", value):
        raise ValueError(f"{what} {ascii(value)} is not in Unicode normal form NFC; write it as "
                         f"{ascii(unicodedata.normalize('NFC', value))}, which prints the same")
    return value


def check_dotted_name(value: str, what: str) -> str:
    """A dotted name (``model.layers.0``, ``mlp.w1``): printable, no empty segment, no surrounding spaces."""
    check_printable(value, what)
    if value and value[0] != "." and value[-1] != "." and ".." not in value and value == value.strip():
        return value  # the common case, without splitting
    if not value or value != value.strip():
        raise ValueError(f"{what} must be a non-empty name without surrounding spaces (got {value!r})")
    raise ValueError(f"{what} {value!r} has an empty segment (leading, trailing or double dot)")


def check_dotted_names(values: Iterable[str], what: str) -> None:
    """``check_dotted_name`` on each of ``values`` in order (the first bad one raises), each
    distinct name checked once: a spec lists the same param names in every layer."""
    if _passed.issuperset(values):
        return
    for value in values:
        if value not in _passed:
            check_dotted_name(value, what)
            if len(_passed) >= _MAX_PASSED:
                _passed.clear()
            _passed.add(value)


def check_name(value: str, what: str) -> str:
    """A plain name (a hardware profile's, a plan's model): printable, without surrounding spaces."""
    check_printable(value, what)
    if value != value.strip():
        raise ValueError(f"{what} must be without surrounding spaces (got {value!r})")
    return value


PrintableName = Annotated[str, Field(min_length=1), AfterValidator(lambda v: check_name(v, "the name"))]
PrintableText = Annotated[str, AfterValidator(lambda v: check_printable(v, "the text"))]
DottedName = Annotated[str, AfterValidator(lambda v: check_dotted_name(v, "the name"))]
