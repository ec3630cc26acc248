"""Writing a set of files all or none: every multi-file output (a rank set) goes through ``write_set``.

1. Every path is checked as ``-o PATH`` is (planner/cli/output.py): a folder, a read-only file or a missing
   folder in the way refuses the whole set before anything is written. A pipe or a device cannot take
   part in an all-or-none write, so it is refused as well.
2. Every new text is written to a temporary file beside its path and flushed to disk.
3. Each path that exists is kept under a backup name (a hard link, or a rename where the file system has
   none), then the new file is renamed over it; each file to remove is renamed to a backup name.
4. Only when every step succeeded are the backups deleted. A failure at any step undoes the steps done,
   in reverse, so the folder is exactly as before, with no temporary file left; the error names the
   user's path, never a temporary name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from planner.cli.output import cannot, output_target, stage

UNWRITTEN = "nothing of the set was written"


def write_set(files: Mapping[str | Path, str | bytes], remove: Iterable[str | Path] = ()) -> None:
    """Write every ``files`` path its text and remove every ``remove`` path, all or none (module docstring);
    an OSError naming the user's path otherwise."""
    targets: dict[str, str] = {}
    staged: dict[str, str] = {}
    try:
        for path in files:
            targets[str(path)] = _target(str(path))
        for path, text in files.items():
            staged[str(path)] = stage(targets[str(path)], text)
    except BaseException as err:
        _discard(staged.values())
        raise _named(err, str(path)) from None
    _commit(targets, staged, [str(p) for p in remove])


def _target(path: str) -> str:
    try:
        target, direct = output_target(path)
    except IsADirectoryError:
        raise cannot(errno.EISDIR, path, "a folder is in the way") from None
    if direct:
        raise cannot(errno.EINVAL, path, "a pipe or a device cannot be one file of a set")
    return target


def _commit(targets: dict[str, str], staged: dict[str, str], remove: list[str]) -> None:
    """Steps 3 and 4 of the module docstring; each step done is recorded so that a failure undoes it."""
    done: list[_Step] = []
    current = ""
    try:
        for current, target in targets.items():
            step = _Step(target, *_keep(target)) if os.path.lexists(target) else _Step(target)
            done.append(step)
            os.replace(staged[current], target)
            del staged[current]
            step.replaced = True
        for current in remove:
            step = _Step(current, _backup_name(current))
            os.replace(current, step.backup)  # type: ignore[arg-type]
            done.append(step)
    except BaseException as err:
        for step in reversed(done):
            step.undo()
        _discard(staged.values())
        raise _named(err, current) from None
    with contextlib.suppress(OSError):  # the set is written; a backup that cannot go is no failure of it
        _discard(step.backup for step in done if step.backup is not None)


@dataclass
class _Step:
    """One path of the set on its way: its backup (None: the path was new), whether the backup is a second
    link to the file still at ``path``, and whether the new file has been renamed over ``path``."""

    path: str
    backup: str | None = None
    linked: bool = False
    replaced: bool = False

    def undo(self) -> None:
        if self.backup is None:
            if self.replaced:
                os.unlink(self.path)  # a new file where there was none
        elif self.linked and not self.replaced:
            os.unlink(self.backup)  # the old file never left
        else:
            os.replace(self.backup, self.path)  # the old file back, over the new one if it came


def _keep(path: str) -> tuple[str, bool]:
    """A backup name holding ``path``'s file, and whether it is a second link (the file stays in place);
    where the file system has no hard links the file is renamed to it."""
    backup = _backup_name(path)
    try:
        os.link(path, backup, follow_symlinks=False)
    except OSError:
        os.replace(path, backup)
        return backup, False
    return backup, True


def _backup_name(path: str) -> str:
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{secrets.token_hex(4)}.old")


def _undo(done: list[tuple[str, str | None, bool]]) -> None:
    for path, backup, replaced in reversed(done):
        if backup is not None:
            os.replace(backup, path)  # the old file back (over the new one, if it was renamed in)
        elif replaced:
            os.unlink(path)  # a new file where there was none


def _discard(paths: Iterable[str]) -> None:
    for path in list(paths):
        Path(path).unlink(missing_ok=True)


def _named(err: BaseException, path: str) -> BaseException:
    """``err`` said of the user's ``path`` (an OSError names a temporary file), with what was left."""
    if not isinstance(err, OSError):
        return err
    reason = err.strerror or str(err)
    reason = reason if reason.startswith("cannot write") else f"cannot write: {reason}"
    return OSError(err.errno or errno.EIO, f"{reason}; {UNWRITTEN}", path)
