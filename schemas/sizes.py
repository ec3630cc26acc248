"""Byte sizes: a whole number of bytes, or a number with a unit.

The one grammar, for the command line and for files alike: a number (``20``, ``1.5``,
``.5``) and an optional unit, with at most one space between them (``20GB``, ``12 GiB``).
Units are ``B``, decimal ``KB MB GB TB PB EB`` (powers of 10) and binary
``KiB MiB GiB TiB PiB EiB`` (powers of 2), in any letter case. A bare number is bytes and
must be whole; with a larger unit, the fraction of a byte left over is dropped. The whole
text must match: no trailing text, signs, exponents, commas or underscores. In a file, a
size is a string or an int; a bool or a float (``1.5e10``) is refused. The result is
between 1 and ``MAX_BYTES``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any, Union

from pydantic import PlainValidator, TypeAdapter, WithJsonSchema

from schemas.errors import suggest

MAX_BYTES = 2**63 - 1  # the largest int64: the most bytes a size, a tensor or a plan may count

UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15, "eb": 10**18,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50, "eib": 2**60,
}
_UNIT_NAMES = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

_SPACE = " \t\r\n"  # what may surround a size (str.strip() would also drop \x1c-\x1f and Unicode spaces)
_MAX_TEXT = 64  # longer text is no size (and is never handed to int(), whose digit limit would raise)
_SIZE_TEXT = re.compile(r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?: ?([A-Za-z]+))?", re.ASCII)

EXAMPLES = "a size such as 20GB, 12 GiB, 1.5TB or a whole number of bytes"


def _shown(value: Any) -> str:
    """The input as it may be printed: repr escapes control and invisible characters; long text
    is cut and huge ints are not spelled out (Python refuses to print ints of over 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"{'-' if value < 0 else ''}a {value.bit_length()}-bit number"
    if isinstance(value, str) and len(value) > 40:
        return repr(value[:37]) + "..."
    return repr(value)


def _expected(value: Any, why: str = "") -> ValueError:
    return ValueError(f"expected {EXAMPLES} (got {_shown(value)}{': ' + why if why else ''})")


def _unit(name: str, value: str) -> int:
    mult = UNITS.get(name.lower())
    if mult is None:
        raise ValueError(f"unknown size unit {name!r} in {_shown(value)}{suggest(name, _UNIT_NAMES, cutoff=0.5)}; "
                         f"expected one of {', '.join(_UNIT_NAMES)}")
    return mult


def _why_not(text: str) -> str:
    """A hint for text that is no size, when a common slip explains it."""
    if "," in text or "_" in text:
        return "a decimal point is '.', and digits are not grouped"
    if re.match(r"[0-9.]+[eE][-+]?[0-9]", text):
        return "no exponents; write the digits, e.g. 12GB"
    if text.count(".") > 1:
        return "more than one decimal point"
    head = _SIZE_TEXT.match(text)
    if head and head.group(2) and head.group(2).lower() in UNITS:
        return "nothing may follow the unit"
    return ""


def _from_text(value: str) -> int:
    text = value.strip(_SPACE)
    if len(text) > _MAX_TEXT:
        raise _expected(value, "too long to be a size")
    match = _SIZE_TEXT.fullmatch(text)
    if match is None:
        if text[:1] == "-" and _SIZE_TEXT.fullmatch(text[1:]):
            raise ValueError(f"must be > 0 (got {_shown(value)}): a size is a positive number of bytes")
        raise _expected(value, _why_not(text))
    number, unit = match.groups()
    mult = _unit(unit, value) if unit else 1
    exact = Fraction(number) * mult
    if mult == 1 and exact.denominator != 1:
        raise ValueError(f"a number of bytes must be whole (got {_shown(value)}); "
                         "for a fraction give a unit, e.g. 1.5GB")
    n = int(exact)  # whole bytes; a fraction of a byte is dropped
    if n < 1:
        raise ValueError(f"must be > 0 (got {_shown(value)}"
                         f"{', less than 1 byte' if exact > 0 else ''}): a size is a positive number of bytes")
    return n


def size_bytes(value: Any) -> int:
    """``value`` (an int of bytes, or text such as ``20GB``) as a number of bytes; ValueError saying
    what is wrong otherwise. This is the one size parser: files and the command line use it."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        what = "a true/false value" if isinstance(value, bool) else f"a {type(value).__name__}"
        raise _expected(value, f"{what}, not a size")
    n = value if isinstance(value, int) else _from_text(value)
    if n < 1:
        raise ValueError(f"must be > 0 (got {_shown(value)}): a size is a positive number of bytes")
    if n > MAX_BYTES:
        raise ValueError(f"must be at most 2^63-1 bytes, about 8 EiB (got {_shown(value)})")
    return n


_JSON_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_BYTES, "description": "bytes"},
        {"type": "string", "pattern": r"^[ \t\r\n]*([0-9]+(\.[0-9]+)?|\.[0-9]+)( ?[A-Za-z]+)?[ \t\r\n]*$",
         "description": "a number and a unit: B, KB, MB, GB, TB, PB, EB (powers of 10) or "
                        "KiB, MiB, GiB, TiB, PiB, EiB (powers of 2)"},
    ]
}

# a size field of a spec: validated by size_bytes, held as an int of bytes
Size = Annotated[int, PlainValidator(size_bytes), WithJsonSchema(_JSON_SCHEMA)]

_SIZE = TypeAdapter(Size)


def size_or_zero(value: Any) -> int:
    """A size, or ``0`` (an int or the text ``0``): an amount of memory that may be none at all."""
    if not isinstance(value, bool) and (value == 0 or (isinstance(value, str) and value.strip() == "0")):
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise ValueError(f"must be 0 or more (got {_shown(value)}): an amount of memory")
    return size_bytes(value)


def size_or_auto(value: Any) -> int | str:
    """A size, or the word ``auto`` (memory.kv_cache: what the plan leaves)."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    try:
        return size_bytes(value)
    except ValueError as err:
        raise ValueError(f"{err}, or auto") from None


SizeOrAuto = Annotated[Union[int, str], PlainValidator(size_or_auto), WithJsonSchema(
    {"anyOf": [*_JSON_SCHEMA["anyOf"], {"const": "auto"}]})]


# a size field that may be 0 (memory.workspace, memory.activations: none at all)
SizeOrZero = Annotated[int, PlainValidator(size_or_zero), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_BYTES, "description": "bytes"},
               _JSON_SCHEMA["anyOf"][1]]})]


def parse_size(value: int | str) -> int:
    """Parse a size such as ``20GB`` or ``12 GiB`` into bytes (raises pydantic.ValidationError)."""
    return int(_SIZE.validate_python(value))


def format_bytes(n: int) -> str:
    """Human form with binary units, exact enough for a review: ``15.00 GiB``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{n} B"
