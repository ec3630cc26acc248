"""`-o PATH` writes where the user asked, and only there (planner/cli/output.py).

Regular files are replaced atomically; symlinks are followed to the file they end at and
stay links; FIFOs and character devices are written directly, never renamed over; every
failure is an OSError naming the path as the user gave it.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_samples import TINY_SPEC, invoke

from planner.cli import output

TEXT = "plan_version: 2\n" + "x: 1\n" * 2000


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def through_fifo(fifo: Path, write: Callable[[], object], timeout: float = 30.0) -> tuple[str, object]:
    """What ``write()`` (run in a thread) writes into ``fifo``, read here, and what it returned. The FIFO is
    opened for reading first (non-blocking), so the writer's open never waits for a reader, and nothing
    here waits past ``timeout``: a writer that never finishes fails the test instead of hanging the run."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    done: dict[str, object] = {}
    writer = threading.Thread(target=lambda: done.update(value=write()), daemon=True)
    writer.start()
    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            events = poller.poll(100)
            data = os.read(fd, 1 << 16) if events else b""
            chunks.append(data)
            if events and not data and not writer.is_alive():  # the writer closed its end: EOF
                break
            if not events and not writer.is_alive() and "value" in done:  # it never opened the FIFO
                break
    finally:
        os.close(fd)
    writer.join(max(0.0, deadline - time.monotonic()))
    if writer.is_alive():
        pytest.fail(f"writing {fifo} did not finish within {timeout} s")
    return b"".join(chunks).decode(), done.get("value")


# ---------------------------------------------------------------------------
# regular files


def test_a_new_file_is_created_with_the_umask_mode(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    output.write_output(str(out), TEXT)
    assert out.read_text() == TEXT
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    assert names(tmp_path) == ["p.yaml"]


def test_an_existing_file_is_replaced_whole_and_keeps_its_mode(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    out.write_text("old\n")
    out.chmod(0o640)
    before = out.stat().st_ino
    output.write_output(str(out), TEXT)
    assert out.read_text() == TEXT
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert out.stat().st_ino != before  # a new file renamed over the old one: atomic
    assert names(tmp_path) == ["p.yaml"]


def test_a_failed_rename_names_the_users_path_and_keeps_the_old_file(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "p.yaml"
    out.write_text("old\n")

    def no_space(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", src)

    monkeypatch.setattr(output.os, "replace", no_space)
    with pytest.raises(OSError) as info:
        output.write_output(str(out), TEXT)
    assert info.value.filename == str(out) and ".tmp" not in str(info.value)
    assert "cannot write: No space left on device" in info.value.strerror
    assert out.read_text() == "old\n" and names(tmp_path) == ["p.yaml"]


def test_a_temporary_file_that_cannot_be_made_is_reported_under_the_users_path(tmp_path: Path,
                                                                               monkeypatch) -> None:
    def denied(prefix: str, suffix: str, dir: Path) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, "Permission denied", str(dir / f"{prefix}abc{suffix}"))

    monkeypatch.setattr(output.tempfile, "mkstemp", denied)
    result = invoke("schema", "plan", "-o", str(tmp_path / "s.json"))
    assert result.exit_code == 2
    assert f"{tmp_path / 's.json'}: cannot write: Permission denied" in result.stderr
    assert ".tmp" not in result.stderr


def test_a_read_only_file_is_not_replaced(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "p.yaml"
    out.write_text("old\n")
    out.chmod(0o444)
    monkeypatch.setattr(output.os, "access", lambda path, mode: False)  # as a non-root user sees it
    with pytest.raises(PermissionError) as info:
        output.write_output(str(out), TEXT)
    assert info.value.filename == str(out) and "read-only" in info.value.strerror
    assert out.read_text() == "old\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_folder_without_write_permission_is_bad_input(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = invoke("schema", "spec", "-o", str(folder / "s.json"))
    finally:
        folder.chmod(0o755)
    assert result.exit_code == 2 and "is not writable" in result.stderr


# ---------------------------------------------------------------------------
# symlinks


def test_a_symlink_chain_is_followed_and_every_link_stays(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "p.yaml"
    real.write_text("old\n")
    (tmp_path / "link1").symlink_to("real/p.yaml")  # relative to the link's folder
    (tmp_path / "link2").symlink_to(tmp_path / "link1")  # absolute
    output.write_output(str(tmp_path / "link2"), TEXT)
    assert real.read_text() == TEXT
    assert (tmp_path / "link1").is_symlink() and (tmp_path / "link2").is_symlink()
    assert os.readlink(tmp_path / "link1") == "real/p.yaml"
    assert names(tmp_path) == ["link1", "link2", "real"] and names(tmp_path / "real") == ["p.yaml"]


def test_a_dangling_symlink_gets_its_target_created(tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    link = tmp_path / "latest.yaml"
    link.symlink_to("plans/new.yaml")
    output.write_output(str(link), TEXT)
    assert link.is_symlink() and (tmp_path / "plans" / "new.yaml").read_text() == TEXT


def test_a_dangling_symlink_into_a_missing_folder_names_the_link_and_the_folder(tmp_path: Path) -> None:
    link = tmp_path / "latest.yaml"
    link.symlink_to("gone/new.yaml")
    with pytest.raises(FileNotFoundError) as info:
        output.write_output(str(link), TEXT)
    assert info.value.filename == str(link)
    assert "the folder" in info.value.strerror and "gone" in info.value.strerror
    assert link.is_symlink() and names(tmp_path) == ["latest.yaml"]


def test_a_symlink_loop_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError) as info:
        output.write_output(str(tmp_path / "a"), TEXT)
    assert info.value.errno == errno.ELOOP and info.value.filename == str(tmp_path / "a")


# ---------------------------------------------------------------------------
# FIFOs and character devices: written directly


def test_a_fifo_is_written_directly_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    received, result = through_fifo(fifo, lambda: invoke("plan", "-", "-g", "8KB", "-o", str(fifo), stdin=TINY_SPEC))
    assert result.exit_code == 0, result.output  # type: ignore[union-attr]
    assert received.startswith("plan_version: 2\n")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert names(tmp_path) == ["plan.fifo"]


def test_a_symlink_to_a_fifo_writes_into_the_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    (tmp_path / "out").symlink_to("plan.fifo")
    received, _ = through_fifo(fifo, lambda: output.write_output(str(tmp_path / "out"), TEXT))
    assert received == TEXT and stat.S_ISFIFO(fifo.lstat().st_mode) and (tmp_path / "out").is_symlink()


def test_a_character_device_is_written_directly_not_replaced(tmp_path: Path) -> None:
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the null device, in a temp folder
    except (PermissionError, OSError) as err:
        pytest.skip(f"cannot make a device node here: {err}")
    result = invoke("schema", "spec", "-o", str(device))
    assert result.exit_code == 0, result.output
    assert stat.S_ISCHR(device.lstat().st_mode) and names(tmp_path) == ["null"]


def test_a_proc_fd_link_to_a_pipe_is_written_directly() -> None:
    """/dev/stdout is such a link: the kernel resolves it, a readlink chain would not."""
    read_end, write_end = os.pipe()
    try:
        output.write_output(f"/proc/self/fd/{write_end}", "through the pipe\n")
        assert os.read(read_end, 100) == b"through the pipe\n"
    finally:
        os.close(read_end)
        os.close(write_end)


# ---------------------------------------------------------------------------
# paths that cannot be written


@pytest.mark.parametrize("make, given, fragment", [
    (lambda d: (d / "plans").mkdir(), "plans", "Is a directory"),
    (lambda d: None, "no/such/p.yaml", "the folder"),
    (lambda d: (d / "f.txt").write_text("x"), "f.txt/p.yaml", "is not a folder"),
    (lambda d: None, "newdir/", "names a folder"),
])
def test_paths_that_cannot_be_written_name_the_path_given(tmp_path: Path, monkeypatch, make, given: str,
                                                          fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    before = names(tmp_path)
    result = invoke("plan", "-", "-g", "8KB", "-o", given, stdin=TINY_SPEC)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {given}: cannot write: ") and fragment in result.stderr
    assert names(tmp_path) == before


def test_dash_writes_stdout() -> None:
    result = invoke("schema", "plan", "-o", "-")
    assert result.exit_code == 0 and result.stdout.startswith("{")
