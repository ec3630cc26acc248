"""Reading one input file (or stdin) whole, with a cap on its size: the one reader every file the
planner and the runtime read goes through (specs, plans, hardware profiles, measured stats, the plans
manifest, a Hugging Face config.json, a safetensors index).

A regular file larger than the cap is refused from its size, before it is read; anything else
(stdin, a pipe, a FIFO, ``/dev/zero``) is read in pieces, at most the cap plus one byte, so an endless
stream ends in a message instead of filling memory. docs/DESIGN.md, "Limits", lists the cap.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

from schemas.errors import InputError
from schemas.sizes import format_bytes

# a plan at the spec caps (2,000,000 params) is about 190 MB as YAML and 360 MB as JSON
MAX_INPUT_BYTES = 512 * 2**20
_PIECE = 1 << 20


def input_name(path: str | Path) -> str:
    """How messages name ``path`` (``-``: stdin)."""
    return "<stdin>" if str(path) == "-" else str(path)


def _too_large(name: str, limit: int, size: int | None) -> InputError:
    cap = f"more than the {format_bytes(limit)} an input file may take"
    what = f"{format_bytes(size)}, {cap}" if size is not None else f"{cap}: read that much without reaching its end"
    return InputError(f"{name}: {what} (docs/DESIGN.md, \"Limits\"); expected a spec, plan or config file")


def _read_capped(f: BinaryIO, name: str, limit: int) -> bytes:
    pieces = []
    left = limit + 1
    while left > 0:
        piece = f.read(min(_PIECE, left))
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    if left <= 0:
        raise _too_large(name, limit, None)
    return b"".join(pieces)


def read_input(path: str | Path, limit: int | None = None) -> bytes:
    """The bytes of the file at ``path`` (``-``: stdin), at most ``limit`` (default MAX_INPUT_BYTES);
    InputError naming the file when it is missing, a folder, unreadable or larger than that."""
    name = input_name(path)
    limit = MAX_INPUT_BYTES if limit is None else limit
    if str(path) == "-":
        return _read_capped(sys.stdin.buffer, name, limit)
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError
            if stat.S_ISREG(info.st_mode) and info.st_size > limit:
                raise _too_large(name, limit, info.st_size)
            return _read_capped(f, name, limit)
    except FileNotFoundError:
        broken = os.path.islink(path)
        raise InputError(f"{name}: cannot read: a link to a missing file" if broken else f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a directory, not a file") from None
    except PermissionError:
        raise InputError(f"{name}: permission denied") from None
    except OSError as err:
        raise InputError(f"{name}: cannot read: {err.strerror or err}") from None
