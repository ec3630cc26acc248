"""The two shapes of a bad-input case."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class CliCase:
    """``planner ARGS`` in a fresh temporary folder.

    In ``args``, ``{d}`` is that folder and ``{f}`` is ``{d}/bad.yaml``. ``files`` are written
    into the folder first (name -> text or bytes); ``setup`` may prepare more (a symlink, say).
    """

    id: str
    args: tuple[str, ...]
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    exit: int = 2
    expect: tuple[str, ...] = ()  # fragments that must appear in the output (stdout + stderr)
    stdin: str | None = None
    setup: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class ApiCase:
    """A Python call that must raise ``error`` whose message holds every ``expect`` fragment.

    ``call`` gets a fresh temporary folder. ``after`` (optional) then checks the state the
    failure left behind (e.g. that a model's weights are unchanged) and raises on a problem.
    """

    id: str
    call: Callable[[Path], object]
    error: type[BaseException] | tuple[type[BaseException], ...]
    expect: tuple[str, ...] = ()
    after: Callable[[Path], None] | None = None
