"""The field types of every file model, defined once: the strict base model, whole numbers and real numbers.

``StrictModel``: unknown keys are errors (a misspelled key never silently does nothing) and loaded models
are frozen.

Whole numbers: strict (a bool, a string or a float is refused, so ``repeat: "4"`` or ``shape: [true, 10]``
is an error) and at most the largest int64.

Real numbers: strict as the whole numbers (a string such as ``"55.3"`` or a bool is refused; an int is a
real number and is accepted), finite (``.inf``, ``.nan`` and numbers past the float range are refused) and
in range: each quantity kind has the bounds of a real machine, so that a figure such as a link of 1e-300
GB/s or a kernel launch of 1e308 us, which no machine has, is refused where it is read instead of turning a
prediction into ``inf``; sums and products of figures in range stay finite. Every figure read from a file
(hardware profiles, workloads, a plan's predictions, measured stats) has one of the types below; a figure
read from elsewhere (a command-line flag) goes through ``Quantity.check``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict


class StrictModel(BaseModel):
    """Unknown keys are errors, so a misspelled key never silently does nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------
# Whole numbers

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


# ---------------------------------------------------------------------------
# Real numbers

MAX_SECONDS = 86400.0  # the longest time any figure may be: a day


@dataclass(frozen=True)
class Quantity:
    """A kind of figure: its unit and the range a real machine's figure lies in."""

    unit: str  # "GB/s", "ms", ... ("" for a plain number)
    low: float
    high: float
    low_open: bool = False  # the low bound itself is out of range (a figure that must be > low)

    def check(self, value: float) -> float:
        """``value`` if finite and in range, else ValueError saying what was expected."""
        if math.isfinite(value) and (value > self.low if self.low_open else value >= self.low) \
                and value <= self.high:
            return value
        return self._refuse(value)

    def expected(self) -> str:
        """What a figure of this kind must be, as words: 'a number >= 0.001 and <= 1e+06 GB/s'."""
        low = f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
        return f"a number {low} and <= {self.high:g}{f' {self.unit}' if self.unit else ''}"

    def _refuse(self, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number (got {value})")
        raise ValueError(f"must be {self.expected()} (got {value:g}): outside the range of a real machine")

    def of(self) -> Any:
        """The pydantic type of a field of this kind."""
        return Annotated[float, Strict(), AfterValidator(self.check),
                         Field(json_schema_extra={"exclusiveMinimum" if self.low_open else "minimum": self.low,
                                                  "maximum": self.high})]


# rates of a link, a memory or a matmul unit: 1 MB/s to 1 PB/s (GB/s), 1 GFLOP/s to 1 EFLOP/s (TFLOP/s)
GBPS = Quantity("GB/s", 1e-3, 1e6)
TFLOPS = Quantity("TFLOP/s", 1e-3, 1e6)
MEASURED_GBPS = Quantity("GB/s", 0.0, 1e6)  # a measured rate: 0 when nothing was copied
# times: from 0 to a day
MICROSECONDS = Quantity("us", 0.0, MAX_SECONDS * 1e6)
MILLISECONDS = Quantity("ms", 0.0, MAX_SECONDS * 1e3)
POSITIVE_MICROSECONDS = Quantity("us", 0.0, MAX_SECONDS * 1e6, low_open=True)
# a predicted throughput: tokens per second
TOKENS_PER_S = Quantity("tokens/s", 0.0, 1e12)
# a relative share (a workload's weight)
SHARE = Quantity("", 1e-6, 1e6)
# how many times a weight is read (a UVA matmul's passes over it)
PASSES = Quantity("", 1.0, 1e6)
# memory traffic per element of a tensor (a block's elementwise work per output element of its matrices)
BYTES_PER_ELEMENT = Quantity("bytes", 0.0, 1e6)
# GiB of host memory (vLLM's --cpu-offload-gb): up to the int64 bytes a size can be
GIB = Quantity("GiB", 0.0, float(2**63 - 1) / 2**30)

Rate = GBPS.of()
Tflops = TFLOPS.of()
MeasuredRate = MEASURED_GBPS.of()
Microseconds = MICROSECONDS.of()
PositiveMicroseconds = POSITIVE_MICROSECONDS.of()
Milliseconds = MILLISECONDS.of()
Share = SHARE.of()
TokensPerSecond = TOKENS_PER_S.of()
Passes = PASSES.of()
BytesPerElement = BYTES_PER_ELEMENT.of()
