"""What a forward processes: named forwards with their token counts, sequences and KV cache (``decode`` at
batch 1 by default).

An item says how many rows a forward pushes through each weight (``tokens``), in how many sequences
(``batch``), how many tokens each sequence holds in the KV cache once the forward has run (``context``),
and which logits the forward returns (``logits``):

- ``decode: {batch: 32, context: 4096}``: a decode step of 32 sequences, one new token each (32 tokens),
  each with a 4,096-token KV cache.
- ``decode: {batch: auto, context: 4096}``: the planner chooses the batch that gives the most tokens per
  second with its KV cache inside the budget (``planner.memory.throughput``).
- ``prefill: {tokens: 2048}``: one forward of 2,048 tokens; ``prefill: {tokens: 2048, context: 2048}``
  keeps their keys and values (one sequence).
- ``decode: {tokens: 32}``: today's form, 32 tokens; without ``context`` no KV cache is counted.

``batch`` left out is ``tokens`` for a decode step (every name but those starting with ``prefill``: one
new token a sequence) and 1 for a prefill (one sequence of ``tokens`` new tokens): ``batch_of``; the plan
records what it assumed. ``logits``: ``all`` (a plain forward returns every token's logits, the default)
or ``last`` (``generate()`` asks for the last token of each sequence, ``logits_to_keep=1``, in its prefill
as in its decode steps, and keeps a float32 copy and the processed scores).

``mode`` is how the forward runs: ``eager`` (PyTorch issues each kernel from Python: the CPU's
issue time counts) or ``graph`` (a CUDA graph replays it: transformers' static-cache
``generate()``, ``torch.compile(mode="reduce-overhead")``, ``torch.cuda.graph``; no CPU issue
time). In a spec: ``decode: {tokens: 1, mode: graph}``; on the command line ``--mode graph``.

On the command line (``parse_workload_option``, the same rules): ``-w decode``, ``-w prefill=2048``,
``-w decode=32:0.9``, ``-w decode=32@4096`` (32 sequences at a 4,096-token context), ``-w decode=auto@4096``;
``--tokens 32`` is ``decode=32`` and ``--context N`` gives every forward without one a context of N.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import Field, PlainValidator, RootModel, ValidationError, WithJsonSchema, field_validator, model_validator

from schemas.errors import LocatedValueError
from schemas.fields import SHARE, PositiveCount, Share, StrictModel

# token counts a bare name stands for
DEFAULT_TOKENS: dict[str, int] = {"decode": 1, "prefill": 2048}
MAX_TOKENS = 10**9
MAX_CACHED = 10**12  # batch x context: the KV cache's tokens
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
Mode = Literal["eager", "graph"]
MODES: tuple[str, ...] = ("eager", "graph")
Logits = Literal["all", "last"]
AUTO = "auto"


def _batch(value: Any) -> int | str:
    """A batch: a whole number of sequences from 1 to MAX_TOKENS, or ``auto``."""
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TOKENS:
        raise ValueError(f"expected a whole number of sequences from 1 to {MAX_TOKENS}, or auto (got {value!r})")
    return value


Batch = Annotated[Union[int, str], PlainValidator(_batch), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_TOKENS}, {"const": AUTO}]})]


def is_prefill(name: str) -> bool:
    """A forward named ``prefill...`` is one sequence of new tokens; any other is a decode step."""
    return name.startswith("prefill")


class WorkloadItem(StrictModel):
    tokens: PositiveCount | None = Field(
        default=None, le=MAX_TOKENS, description="rows a forward pushes through each weight (default: the batch)")
    batch: Batch | None = Field(
        default=None, description="sequences in the forward, or auto: chosen for the most tokens per second "
        "(default: tokens for a decode step, 1 for a prefill)")
    context: PositiveCount | None = Field(
        default=None, le=MAX_TOKENS, description="tokens each sequence holds in the KV cache after this forward "
        "(default: none, no KV cache counted)")
    logits: Logits | None = Field(
        default=None, description="all: the logits of every token (a plain forward, the default); last: of the "
        "last token of each sequence (generate())")
    weight: Share = Field(default=1.0, description="share of forwards of this kind (relative)")
    mode: Mode = Field(default="eager", description="eager (the CPU issues each kernel) or graph (CUDA graph "
                       "replay: no CPU issue time)")

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadItem:
        if self.batch == AUTO:
            if self.tokens is not None:
                raise LocatedValueError("batch auto chooses the batch, and the tokens follow from it (a decode step "
                                        "of one new token a sequence): leave tokens out", ("tokens",))
            if self.context is None:
                raise LocatedValueError("batch auto needs a context: the KV cache of the sequences is what bounds "
                                        "the batch (e.g. {batch: auto, context: 4096})", ("context",))
            return self
        if self.tokens is None and self.batch is None:
            raise LocatedValueError("give tokens (rows a forward pushes through each weight) or batch (sequences, "
                                    "one new token each), e.g. {batch: 32, context: 4096} or {tokens: 2048}",
                                    ("tokens",))
        if isinstance(self.batch, int) and self.tokens is not None and self.batch > self.tokens:
            raise LocatedValueError(f"{self.batch} sequences push at least one token each, more than the "
                                    f"{self.tokens} tokens given", ("batch",))
        return self

    @property
    def auto(self) -> bool:
        return self.batch == AUTO

    @property
    def rows(self) -> int:
        """The tokens of one forward (``tokens``, else the batch); not for batch auto."""
        if self.tokens is not None:
            return self.tokens
        assert isinstance(self.batch, int), "batch auto has no tokens until the batch is chosen"
        return self.batch


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
        for name, item in value.items():
            _check_context(name, item)
        auto = [name for name, item in value.items() if item.auto]
        prefills = [name for name in auto if is_prefill(name)]
        if prefills:
            raise LocatedValueError(f"batch auto is for a decode step (one new token a sequence); {prefills[0]!r} is "
                                    "a prefill, one sequence of its tokens: give it tokens (e.g. {tokens: 2048})",
                                    (prefills[0], "batch"))
        if len(auto) > 1:
            raise LocatedValueError(f"batch auto is given for {' and '.join(auto)}: one forward's batch can be "
                                    "chosen (the others keep theirs)", (auto[1], "batch"))
        return value

    def items(self) -> list[tuple[str, WorkloadItem]]:
        return list(self.root.items())

    @property
    def auto(self) -> str | None:
        """The name of the forward whose batch the planner chooses (batch auto), if any."""
        return next((name for name, item in self.root.items() if item.auto), None)

    def with_batch(self, name: str, batch: int) -> Workload:
        """This workload with ``name``'s batch set (a decode step: as many tokens)."""
        items = dict(self.root)
        items[name] = items[name].model_copy(update={"batch": batch, "tokens": batch})
        return Workload(items)

    def with_context(self, context: int) -> Workload:
        """Every forward without a context given ``context`` (``--context``), checked as in a file."""
        items = {name: item if item.context is not None else
                 WorkloadItem.model_validate({**item.model_dump(exclude_none=True), "context": context})
                 for name, item in self.root.items()}
        return Workload(items)


def batch_of(name: str, item: WorkloadItem) -> int:
    """The sequences of forward ``name``: its batch, else one a token for a decode step and one for a prefill."""
    if isinstance(item.batch, int):
        return item.batch
    assert item.tokens is not None, "batch auto has no batch until it is chosen"
    return 1 if is_prefill(name) else item.tokens


def _check_context(name: str, item: WorkloadItem) -> None:
    """The KV cache holds at least the new tokens of each sequence, and at most MAX_CACHED tokens."""
    if item.context is None or item.auto:
        return
    batch = batch_of(name, item)
    per_sequence = -(-item.rows // batch)
    if item.context < per_sequence:
        each = "its one sequence adds" if batch == 1 else f"each of its {batch} sequences adds"
        raise LocatedValueError(f"a context of {item.context} tokens cannot hold the {per_sequence} new tokens "
                                f"{each} (tokens {item.rows}, batch {batch})", (name, "context"))
    if batch * item.context > MAX_CACHED:
        raise LocatedValueError(f"{batch} sequences of {item.context} tokens is more than {MAX_CACHED:.0e} tokens "
                                "of KV cache", (name, "context"))


DEFAULT_WORKLOAD = Workload({"decode": WorkloadItem(tokens=1)})

_OPTION = re.compile(r"\s*([^=@:\s]+)\s*(?:=\s*([^@:\s]+)\s*)?(?:@\s*([^:\s]+)\s*)?(?::\s*(\S+)\s*)?")
EXPECTED = ("expected NAME[=TOKENS|=auto][@CONTEXT][:WEIGHT], e.g. decode, prefill=2048, decode=32:0.9, "
            "decode=32@4096 or decode=auto@4096")


def parse_workload_option(text: str) -> tuple[str, WorkloadItem]:
    """``NAME[=TOKENS|=auto][@CONTEXT][:WEIGHT]`` -> (name, item); ValueError with what was expected.
    The item is validated as a spec's is (``WorkloadItem``, ``Workload``): one set of rules."""
    m = _OPTION.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r}: {EXPECTED}")
    name, tokens, context, weight = m.groups()
    if not _NAME.fullmatch(name):
        raise ValueError(f"{text!r}: the name {name!r} must be letters, digits, '_' or '-'; {EXPECTED}")
    data: dict[str, Any] = {}
    if tokens is None:
        if name not in DEFAULT_TOKENS:
            raise ValueError(f"{text!r}: give the token count ({name}=N); only "
                             f"{' and '.join(DEFAULT_TOKENS)} have a default")
        data["tokens"] = DEFAULT_TOKENS[name]
    elif tokens == AUTO:
        data["batch"] = AUTO
    elif context is not None and not is_prefill(name):
        data["batch"] = _whole(text, "the batch", tokens)  # decode=32@4096: 32 sequences at 4,096 tokens
    else:
        data["tokens"] = _whole(text, "tokens", tokens)
    if context is not None:
        data["context"] = _whole(text, "the context", context)
    if weight is not None:
        try:
            data["weight"] = SHARE.check(float(weight))
        except ValueError:
            raise ValueError(f"{text!r}: the weight must be {SHARE.expected()} (got {weight!r})") from None
    try:
        item = WorkloadItem.model_validate(data)
        Workload({name: item})
    except ValidationError as err:
        raise ValueError(f"{text!r}: {first_message(err)}") from None
    return name, item


def _whole(text: str, what: str, value: str) -> int:
    if re.fullmatch(r"[0-9]+", value) and 0 < int(value) <= MAX_TOKENS:
        return int(value)
    auto = " or auto" if what in ("tokens", "the batch") else ""
    raise ValueError(f"{text!r}: {what} must be a whole number from 1 to {MAX_TOKENS}{auto} (got {value!r})")


def first_message(err: ValidationError) -> str:
    """The first problem of a workload's validation, as one sentence."""
    e = err.errors()[0]
    cause = e.get("ctx", {}).get("error")
    return str(cause) if cause is not None else e["msg"]
