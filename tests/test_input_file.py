"""The one bounded reader (schemas/input_file.py): a regular file over the cap is refused from its size,
a stream (/dev/zero, a FIFO, stdin) after at most cap + 1 bytes; under the cap the bytes come back whole.
The cap is lowered here (monkeypatch) so the streams end in milliseconds."""

from __future__ import annotations

import io
import os
import sys
import threading
from pathlib import Path

import pytest
from cli_samples import invoke
from hypothesis import given, settings
from hypothesis import strategies as st

import schemas.input_file as input_file
from schemas.errors import InputError
from schemas.input_file import read_input

CAP = 4096


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(input_file, "MAX_INPUT_BYTES", CAP)
    return CAP


class _Counting(io.RawIOBase):
    """An endless stream of b"a" that counts the bytes handed out."""

    def __init__(self) -> None:
        self.given = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = len(b)
        b[:n] = b"a" * n
        self.given += n
        return n


def test_endless_stdin_is_read_at_most_cap_plus_one(monkeypatch: pytest.MonkeyPatch, small_cap: int) -> None:
    raw = _Counting()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(raw, buffer_size=64)))
    with pytest.raises(InputError, match=r"<stdin>: more than the 4.00 KiB an input file may take: read that much"):
        read_input("-")
    assert raw.given <= small_cap + 64 + 1  # the cap + 1, and at most one buffer's read-ahead


def test_dev_zero_from_the_cli(small_cap: int) -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    result = invoke("plan", "/dev/zero")
    assert result.exit_code == 2, result.output
    assert "/dev/zero: more than the 4.00 KiB an input file may take" in result.output
    assert "Traceback" not in result.output


def test_fifo_is_read_as_a_stream(tmp_path: Path, small_cap: int) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)

    def write() -> None:
        try:
            with open(fifo, "wb") as f:
                for _ in range(64):
                    f.write(b"# a comment line that never ends the file\n" * 8)
        except BrokenPipeError:
            pass  # the reader stopped at the cap, as it should

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    result = invoke("validate", str(fifo))
    writer.join(timeout=10)
    assert result.exit_code == 2, result.output
    assert f"{fifo}: more than the 4.00 KiB an input file may take" in result.output


def test_stdin_under_the_cap_still_plans(small_cap: int) -> None:
    from corpus.lockfile import SPEC

    assert len(SPEC.encode()) <= small_cap
    assert invoke("validate", "-", stdin=SPEC).exit_code == 0
    over = SPEC + "#" * (small_cap + 1 - len(SPEC.encode())) + "\n"
    result = invoke("validate", "-", stdin=over)
    assert result.exit_code == 2 and "<stdin>: more than the 4.00 KiB" in result.output


@settings(max_examples=40, deadline=None)
@given(size=st.integers(0, 3 * 64), limit=st.integers(0, 2 * 64), piece=st.sampled_from([1, 7, 64, 1 << 20]))
def test_file_and_stream_agree(tmp_path_factory: pytest.TempPathFactory, size: int, limit: int, piece: int) -> None:
    """Bytes back whole iff they fit the limit, from a regular file and from a pipe read in any piece size."""
    data = bytes(i % 251 for i in range(size))
    path = tmp_path_factory.mktemp("in") / "f.bin"
    path.write_bytes(data)
    read, write = os.pipe()
    feeder = threading.Thread(target=_feed, args=(write, data), daemon=True)
    feeder.start()
    old = input_file._PIECE
    input_file._PIECE = piece
    try:
        results = []
        for source in (str(path), f"/dev/fd/{read}"):
            try:
                results.append(read_input(source, limit))
            except InputError as err:
                assert "more than the" in str(err) and ("f.bin" in str(err) or f"/dev/fd/{read}" in str(err))
                results.append(None)
    finally:
        input_file._PIECE = old
        os.close(read)
        feeder.join(timeout=10)
    expected = data if size <= limit else None
    assert results == [expected, expected]


def _feed(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data) if data else None
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)
