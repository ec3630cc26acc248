"""Real numbers in input files, defined once: strict, as the whole numbers of schemas/ints.py (a string such as
``"55.3"`` or a bool is refused; an int is a real number and is accepted)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

Real = Annotated[float, Strict()]  # bounds, where a field has them, are given with Field(ge=..., gt=...)
PositiveReal = Annotated[float, Strict(), Field(gt=0)]
NonNegativeReal = Annotated[float, Strict(), Field(ge=0)]
