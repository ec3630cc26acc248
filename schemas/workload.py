"""What a forward processes: named token counts with weights (``decode`` at batch 1 by default).

In a spec: ``workload: {decode: {tokens: 1}, prefill: {tokens: 2048, weight: 0.1}}``. On the
command line: ``--workload decode``, ``--workload prefill=2048``, ``--workload decode=32:0.9``,
``--tokens 32`` (decode at 32 tokens). ``tokens`` is the number of rows a forward pushes
through each weight: the batch size for a decode step, batch x prompt length for a prefill.

``mode`` is how the forward runs: ``eager`` (PyTorch issues each kernel from Python: the CPU's
issue time counts) or ``graph`` (a CUDA graph replays it: transformers' static-cache
``generate()``, ``torch.compile(mode="reduce-overhead")``, ``torch.cuda.graph``; no CPU issue
time). In a spec: ``decode: {tokens: 1, mode: graph}``; on the command line ``--mode graph``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, RootModel, field_validator

from schemas.fields import PositiveCount, SHARE, Share, StrictModel


# token counts a bare name stands for
DEFAULT_TOKENS: dict[str, int] = {"decode": 1, "prefill": 2048}
MAX_TOKENS = 10**9
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
Mode = Literal["eager", "graph"]
MODES: tuple[str, ...] = ("eager", "graph")


class WorkloadItem(StrictModel):
    tokens: PositiveCount = Field(le=MAX_TOKENS, description="rows a forward pushes through each weight")
    weight: Share = Field(default=1.0, description="share of forwards of this kind (relative)")
    mode: Mode = Field(default="eager", description="eager (the CPU issues each kernel) or graph (CUDA graph "
                       "replay: no CPU issue time)")


class Workload(RootModel[dict[str, WorkloadItem]]):
    """Named forwards; the plan predicts a step time for each."""

    @field_validator("root")
    @classmethod
    def _names(cls, value: dict[str, WorkloadItem]) -> dict[str, WorkloadItem]:
        if not value:
            raise ValueError("the workload is empty: name at least one forward, e.g. decode: {tokens: 1}")
        for name in value:
            if not _NAME.fullmatch(name):
                raise ValueError(f"workload name {name!r}: letters, digits, '_' and '-' only, not starting "
                                 "with a digit")
        return value

    def items(self) -> list[tuple[str, WorkloadItem]]:
        return list(self.root.items())


DEFAULT_WORKLOAD = Workload({"decode": WorkloadItem(tokens=1)})


def parse_workload_option(text: str) -> tuple[str, WorkloadItem]:
    """``NAME[=TOKENS][:WEIGHT]`` -> (name, item); ValueError with what was expected."""
    m = re.fullmatch(r"\s*([^=:\s]+)\s*(?:=\s*([^:\s]+)\s*)?(?::\s*(\S+)\s*)?", text)
    expected = "expected NAME[=TOKENS][:WEIGHT], e.g. decode, prefill=2048 or decode=32:0.9"
    if m is None:
        raise ValueError(f"{text!r}: {expected}")
    name, tokens, weight = m.groups()
    if not _NAME.fullmatch(name):
        raise ValueError(f"{text!r}: the name {name!r} must be letters, digits, '_' or '-'; {expected}")
    if tokens is None:
        if name not in DEFAULT_TOKENS:
            raise ValueError(f"{text!r}: give the token count ({name}=N); only "
                             f"{' and '.join(DEFAULT_TOKENS)} have a default")
        count = DEFAULT_TOKENS[name]
    elif re.fullmatch(r"[0-9]+", tokens) and 0 < int(tokens) <= MAX_TOKENS:
        count = int(tokens)
    else:
        raise ValueError(f"{text!r}: tokens must be a whole number from 1 to {MAX_TOKENS} (got {tokens!r})")
    share = 1.0
    if weight is not None:
        try:
            share = SHARE.check(float(weight))
        except ValueError:
            raise ValueError(f"{text!r}: the weight must be {SHARE.expected()} (got {weight!r})") from None
    return name, WorkloadItem(tokens=count, weight=share)
