"""Whole numbers in input files, defined once: strict (a bool, a string or a float is refused,
so ``repeat: "4"`` or ``shape: [true, 10]`` is an error) and at most the largest int64."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, Strict

MAX_INT64 = 2**63 - 1


def _int64(n: int) -> int:
    if n > MAX_INT64:
        raise ValueError(f"must be at most 2^63-1 (got a {n.bit_length()}-bit number)")
    return n


_INT64 = Field(json_schema_extra={"maximum": MAX_INT64})

# a count, a dimension, a stride or an index: 0 or more
Count = Annotated[int, Strict(), Field(ge=0), AfterValidator(_int64), _INT64]
# a repeat, a group size, a step: 1 or more
PositiveCount = Annotated[int, Strict(), Field(gt=0), AfterValidator(_int64), _INT64]
