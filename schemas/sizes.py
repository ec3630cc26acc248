"""Byte sizes: ints (bytes) or strings with decimal (GB, MB) or binary (GiB, MiB) units."""

from __future__ import annotations

from typing import Annotated

from pydantic import ByteSize, Field, TypeAdapter

# pydantic's ByteSize parses "20GB" (10**9), "20 GiB" (2**30), "1.5TB"; we also require > 0.
Size = Annotated[ByteSize, Field(gt=0)]

_SIZE = TypeAdapter(Size)


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
