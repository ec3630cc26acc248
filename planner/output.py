"""Writing command output: to stdout for ``-`` (or no path), else atomically to a file."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` through a temporary file in the same folder and a
    rename, so readers see the old file or the whole new one, never a half-written one."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        binary = isinstance(text, bytes)
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="\n")) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def emit(text: str, output: str | None) -> None:
    """Send ``text`` to stdout (``output`` None or ``-``) or atomically to the file ``output``."""
    if output in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomic(output, text)
