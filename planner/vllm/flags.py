"""vLLM's weight-offload flags: one strict parser for the string given to ``plan --from-vllm``.

The flags and their rules, as vLLM defines them (vllm/config/offload.py: ``OffloadConfig`` with
its ``uva`` and ``prefetch`` sub-configs; vllm/model_executor/offloader/base.py:
``create_offloader``), read for this module and restated here:

- ``--cpu-offload-gb X``: a float >= 0, GiB (vLLM offloads up to ``int(X * 1024**3)`` bytes);
  0 (the default) is off. Its ``--cpu-offload-params SEG ...`` narrows it to params matching a
  segment.
- ``--offload-group-size G`` (int >= 0, default 0: off), ``--offload-num-in-group K`` (int >= 1,
  default 1, at most G), ``--offload-prefetch-step S`` (int >= 0, default 1, at least 1 when G > 0)
  and ``--offload-params SEG ...`` (segments; empty: every param of an offloaded layer).
- ``--offload-backend auto|uva|prefetch`` (default auto): auto takes prefetch when G > 0, else UVA
  when X > 0, else nothing (vLLM warns when both are set and takes prefetch). An explicit backend
  ignores the other backend's fields.

As vLLM's argument parser: ``--flag value`` and ``--flag=value`` both work, a flag's underscores
may be dashes (``--cpu_offload_gb``), and the segment lists take one or more space-separated
values. Stricter than argparse, so a typo does not pass silently: an unknown flag, a flag given
twice, an abbreviation, a value with a unit (``4GB``) or a comma list are refused with the flag
named; vLLM's other flags (``--max-model-len`` ...) are refused as not about offloading.
"""

from __future__ import annotations

from fractions import Fraction

import re
import shlex
from dataclasses import dataclass, field

from schemas.errors import InputError, suggest
from schemas.fields import GIB, MAX_INT64

OPTION = "--from-vllm"
BACKENDS = ("auto", "uva", "prefetch")
DEFAULT_PREFETCH_STEP = 1  # vLLM's default --offload-prefetch-step (this planner's own default is 2)

_INT = re.compile(r"[+]?[0-9]+")
_FLOAT = re.compile(r"[+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_LISTS = ("--cpu-offload-params", "--offload-params")
_FLAGS = ("--cpu-offload-gb", "--cpu-offload-params", "--offload-group-size", "--offload-num-in-group",
          "--offload-prefetch-step", "--offload-params", "--offload-backend")


@dataclass(frozen=True)
class VllmFlags:
    """vLLM's offload settings, with vLLM's defaults for the flags not given."""

    cpu_offload_gb: float = 0.0
    cpu_offload_params: tuple[str, ...] = ()
    group_size: int = 0
    num_in_group: int = 1
    prefetch_step: int = DEFAULT_PREFETCH_STEP
    offload_params: tuple[str, ...] = ()
    backend: str = "auto"
    given: tuple[str, ...] = field(default=(), compare=False)  # the flags as given, for notes

    @property
    def mode(self) -> str:
        """The backend vLLM creates: prefetch, uva or none (vLLM's ``create_offloader``)."""
        if self.backend == "auto":
            if self.group_size > 0:
                return "prefetch"
            return "uva" if self.cpu_offload_gb > 0 else "none"
        if self.backend == "prefetch":
            return "prefetch" if self.group_size > 0 else "none"
        return "uva" if self.cpu_offload_gb > 0 else "none"

    @property
    def uva_max_bytes(self) -> int:
        """vLLM's byte limit for --cpu-offload-gb: ``int(gb * 1024**3)``, in float arithmetic as vLLM does."""
        return int(self.cpu_offload_gb * 1024**3)

    def words(self) -> list[str]:
        """The flags of this setting, each one vLLM uses (defaults spelled out, so the line stands alone)."""
        mode = self.mode
        out: list[str] = []
        if mode == "prefetch":
            out += ["--offload-group-size", str(self.group_size), "--offload-num-in-group", str(self.num_in_group),
                    "--offload-prefetch-step", str(self.prefetch_step)]
            if self.offload_params:
                out += ["--offload-params", *self.offload_params]
        elif mode == "uva":
            out += ["--cpu-offload-gb", _float_text(self.cpu_offload_gb)]
            if self.cpu_offload_params:
                out += ["--cpu-offload-params", *self.cpu_offload_params]
        return out

    def text(self) -> str:
        return shlex.join(self.words())


def _float_text(x: float) -> str:
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else repr(x)


def parse_vllm_flags(text: str) -> VllmFlags:
    """The offload settings in ``text`` (vLLM command-line flags), or InputError naming the flag."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise InputError(f"{OPTION}: cannot split {text!r} into words ({err}); quote it as one argument, "
                         "e.g. --from-vllm \"--cpu-offload-gb 4\"") from None
    values: dict[str, list[str]] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise InputError(f"{OPTION}: '{word}' is not a flag (expected one of: {', '.join(_FLAGS)})")
        name, eq, inline = word.partition("=")
        flag = _known(name)
        if flag in values:
            raise InputError(f"{OPTION}: {flag} is given twice (vLLM would take the last; give it once)")
        if eq:
            given = [inline]
            i += 1
        else:
            given = []
            i += 1
            while i < len(words) and not words[i].startswith("--"):
                given.append(words[i])
                i += 1
        if not given or given == [""]:
            raise InputError(f"{OPTION}: {flag} needs a value" + _example(flag))
        if flag not in _LISTS and len(given) > 1:
            raise InputError(f"{OPTION}: {flag} takes one value (got {len(given)}: {' '.join(given)})")
        values[flag] = given
    return _settings(values, tuple(words))


def _known(name: str) -> str:
    """The canonical spelling of flag ``name`` (underscores read as dashes), or InputError."""
    canonical = "--" + name[2:].replace("_", "-")
    if canonical in _FLAGS:
        return canonical
    prefixed = [f for f in _FLAGS if f.startswith(canonical)] if len(canonical) > 2 else []
    if prefixed:
        raise InputError(f"{OPTION}: {name} is not a flag; abbreviations are not read here, give the whole name"
                         f" ({' or '.join(prefixed)})")
    hint = suggest(canonical, _FLAGS)
    raise InputError(f"{OPTION}: unknown flag {name}{hint}; the offload flags read are: {', '.join(_FLAGS)} "
                     "(vLLM's other flags do not change what is offloaded: leave them out)")


def _example(flag: str) -> str:
    examples = {"--cpu-offload-gb": "4", "--offload-backend": "prefetch", "--offload-params": "mlp self_attn",
                "--cpu-offload-params": "experts"}
    return f" (e.g. {flag} {examples.get(flag, '8')})"


def _int(flag: str, text: str, least: int) -> int:
    if not _INT.fullmatch(text.strip()):
        raise InputError(f"{OPTION}: {flag} must be a whole number >= {least} (got '{text}')")
    value = int(text)
    if value < least:
        raise InputError(f"{OPTION}: {flag} must be >= {least} (got {value})")
    if value > MAX_INT64:
        raise InputError(f"{OPTION}: {flag} must be at most 2^63-1 (got a {value.bit_length()}-bit number)")
    return value


def _gib(flag: str, text: str) -> float:
    stripped = text.strip()
    if not _FLOAT.fullmatch(stripped):
        unit = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]+)", stripped)
        why = (f"; vLLM reads a number of GiB, so write {unit.group(1)}" if unit else "")
        raise InputError(f"{OPTION}: {flag} must be a number of GiB >= 0, e.g. 4 or 0.5 (got '{text}'){why}")
    try:
        return GIB.check(float(stripped))
    except ValueError as err:
        raise InputError(f"{OPTION}: {flag} {err}") from None


def _segments(flag: str, given: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for seg in given:
        if "," in seg:
            parts = " ".join(p.strip() for p in seg.split(",") if p.strip())
            raise InputError(f"{OPTION}: {flag} takes segments separated by spaces, not commas (got '{seg}'; "
                             f"write {flag} {parts})")
        if not seg or seg.startswith(".") or seg.endswith(".") or ".." in seg or seg != seg.strip():
            raise InputError(f"{OPTION}: {flag}: '{seg}' is not a dotted name segment (e.g. mlp, "
                             "experts.w2_weight): it can match no param")
        if seg in out:
            raise InputError(f"{OPTION}: {flag}: '{seg}' is listed twice")
        out.append(seg)
    return tuple(out)


def _settings(values: dict[str, list[str]], words: tuple[str, ...]) -> VllmFlags:
    one = {flag: v[0] for flag, v in values.items() if flag not in _LISTS}
    backend = one.get("--offload-backend", "auto")
    if backend not in BACKENDS:
        raise InputError(f"{OPTION}: --offload-backend must be one of {', '.join(BACKENDS)} (got '{backend}')"
                         + suggest(backend, BACKENDS))
    flags = VllmFlags(
        cpu_offload_gb=_gib("--cpu-offload-gb", one["--cpu-offload-gb"]) if "--cpu-offload-gb" in one else 0.0,
        cpu_offload_params=_segments("--cpu-offload-params", values.get("--cpu-offload-params", [])),
        group_size=_int("--offload-group-size", one["--offload-group-size"], 0) if "--offload-group-size" in one
        else 0,
        num_in_group=_int("--offload-num-in-group", one["--offload-num-in-group"], 1)
        if "--offload-num-in-group" in one else 1,
        prefetch_step=_int("--offload-prefetch-step", one["--offload-prefetch-step"], 0)
        if "--offload-prefetch-step" in one else DEFAULT_PREFETCH_STEP,
        offload_params=_segments("--offload-params", values.get("--offload-params", [])),
        backend=backend, given=words)
    if backend == "prefetch" or flags.group_size > 0:  # vLLM's OffloadConfig validator
        if flags.num_in_group > flags.group_size:
            raise InputError(f"{OPTION}: --offload-num-in-group ({flags.num_in_group}) must be <= "
                             f"--offload-group-size ({flags.group_size})")
        if flags.prefetch_step < 1:
            raise InputError(f"{OPTION}: --offload-prefetch-step must be >= 1 when prefetch offloading is on "
                             f"(--offload-group-size {flags.group_size})")
    return flags


def gib_text(low: int, high: int) -> str:
    """The shortest decimal number of GiB X with ``low < int(X * 1024**3) <= high`` (vLLM's own arithmetic)."""
    for digits in range(0, 40):
        scale = 10**digits
        x = Fraction(-((-(low + 1) * scale) // 2**30), scale)  # the smallest multiple of 10^-digits GiB above low
        text = f"{x.numerator // x.denominator}" if digits == 0 else f"{float(x):.{digits}f}"
        if low < int(float(text) * 1024**3) <= high:
            return text
    raise ValueError(f"no decimal GiB between {low} and {high} bytes")
