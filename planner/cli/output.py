"""Writing command output where the user asked, and only there.

- ``-`` or no path: stdout.
- A regular file, or a name that does not exist yet: a temporary file in the same folder,
  then a rename, so readers see the old file or the whole new one.
- A symlink (or a chain of them): the same at the file the chain ends at; the links stay.
  A dangling link: the file it names is created.
- A FIFO or a character device (``/dev/null``, ``/dev/stdout``): written directly; nothing is
  ever renamed over it.
- Anything else (a folder, a missing folder, a read-only file, no permission): an OSError
  whose ``filename`` is the path as the user gave it and whose ``strerror`` says why.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from pathlib import Path

MAX_LINKS = 40  # as the kernel's limit on a chain of symlinks


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` through a temporary file in the same folder and a
    rename, so readers see the old file or the whole new one, never a half-written one."""
    tmp = stage(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stage(path: str | Path, text: str | bytes) -> str:
    """A temporary file beside ``path`` holding ``text``, flushed to disk, with the mode ``path`` has (or
    a new file would get); its name. Nothing is left behind when this fails."""
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
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def cannot(code: int, path: str, why: str = "") -> OSError:
    """OSError (the subclass for ``code``) naming ``path``: ``cannot write: <reason>[ (why)]``."""
    reason = f"cannot write: {os.strerror(code)}" + (f" ({why})" if why else "")
    return OSError(code, reason, path)


def link_target(path: str) -> str:
    """The path a chain of symlinks starting at ``path`` ends at (``path`` when it is no link);
    the end may not exist (a dangling link)."""
    current = path
    for _ in range(MAX_LINKS):
        if not os.path.islink(current):
            return current
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    raise cannot(errno.ELOOP, path)


def _write_directly(path: str, text: str | bytes) -> None:
    try:
        with (open(path, "wb") if isinstance(text, bytes) else
              open(path, "w", encoding="utf-8", newline="\n")) as f:
            f.write(text)
    except OSError as err:
        raise cannot(err.errno or errno.EIO, path) from None


def _check_new_file(path: str, target: str) -> None:
    """``target`` does not exist: its folder must, and be writable."""
    folder = os.path.dirname(target) or "."
    via = f"{path} links to {target}; " if target != path else ""
    if target.endswith(os.sep):
        raise cannot(errno.EISDIR, path, f"{via}a path ending in '{os.sep}' names a folder")
    if not os.path.exists(folder):
        raise cannot(errno.ENOENT, path, f"{via}the folder {folder} does not exist")
    if not os.path.isdir(folder):
        raise cannot(errno.ENOTDIR, path, f"{via}{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise cannot(errno.EACCES, path, f"{via}the folder {folder} is not writable")


def write_output(path: str, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to the file ``path`` as the module docstring says."""
    target, direct = output_target(path)
    if direct:
        _write_directly(path, text)  # a pipe or a device: never renamed over
        return
    try:
        write_atomic(target, text)
    except OSError as err:  # named after the user's path, not the temporary file
        raise cannot(err.errno or errno.EIO, path) from None


def output_target(path: str) -> tuple[str, bool]:
    """The file that writing to ``path`` replaces (the end of its chain of links) and whether it must be
    written directly instead (a pipe, a device, a link the kernel resolves elsewhere); OSError naming
    ``path`` when it cannot be written at all."""
    if not path:
        raise OSError(errno.ENOENT, "cannot write: the output path is empty", "''")
    try:
        found: os.stat_result | None = os.stat(path)  # follows every link, as the kernel does
    except (FileNotFoundError, NotADirectoryError):
        found = None  # a new file, a dangling link, or a file used as a folder (said below)
    except OSError as err:  # a loop of links, no permission
        raise cannot(err.errno or errno.EIO, path) from None
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise cannot(errno.EISDIR, path, "give a file name")
    if found is not None and not stat.S_ISREG(found.st_mode):
        if not (stat.S_ISFIFO(found.st_mode) or stat.S_ISCHR(found.st_mode)):
            raise cannot(errno.EINVAL, path, "not a regular file, a FIFO or a character device")
        return path, True
    target = link_target(path)
    if found is not None and not _same_file(found, target):
        return path, True  # a link the kernel resolves another way (/dev/stdout, /proc/self/fd/1)
    if found is not None and not os.access(path, os.W_OK):
        raise cannot(errno.EACCES, path, "the file is read-only")
    if found is None:
        _check_new_file(path, target)
    return target, False


def _same_file(found: os.stat_result, target: str) -> bool:
    try:
        mine = os.stat(target, follow_symlinks=False)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (found.st_dev, found.st_ino)


def emit(text: str, output: str | None) -> None:
    """Send ``text`` to stdout (``output`` None or ``-``) or to the file ``output`` (write_output)."""
    if output in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_output(output, text)
