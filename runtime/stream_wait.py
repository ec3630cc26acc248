"""A CUDA stream and a host thread that wait for each other: 32-bit counts in pinned host memory.

The cpu backend's host part runs on a thread of its own (runtime/cpu_experts.py); the GPU must not read its rows
before they are written, and the Python thread issuing the forward must not wait for them either (it would stop
issuing the next layers' kernels while the host computes). So the stream itself waits: ``HostFlag.wait`` puts on
the stream a wait until the flag reaches the next count (``cuStreamWaitValue32``), and the host thread raises the
flag to that count when its rows are written. The other way round, ``HostFlag.write`` puts on the stream a write of
a count (``cuStreamWriteValue32``, after the stream's earlier work, the routed tokens' copies to the host) and the
host thread waits for it by reading host memory (``host_wait``): the host thread makes no CUDA call at all. (A
CUDA call on that thread can wait for the stream: freeing a pinned buffer a copy used records an event on the
copy's stream, and that blocks while the stream's queue is full, the stream waiting for this very thread's flag:
measured on the H200 as a stalled `generate()`, docs/BENCHMARKS.md, 2026-12-02 04:20.) The driver's stream memory
operations are reached through ctypes (``libcuda``), so no compiled extension is needed; ``flag_waits(device)`` says
whether they work here (the runtime falls back to the host part on the issuing thread where they do not).

Measured on the H200 machine (bench/results/hybrid-h200-2026-12-01/probe-hybrid-step.jsonl): a wait released by
a host thread 50 ms later ended after 50.7 ms and the copy queued behind it read what the thread had written;
200 waits answered one by one took about 0.1 ms each beyond the thread's sleeps.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from functools import lru_cache

import torch

log = logging.getLogger("runtime")

_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0, so a wrapping count still works
_WRITE_DEFAULT = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT: the write is ordered after the stream's earlier memory writes
_MASK = 0xFFFFFFFF
_HALF = 1 << 31
POLL_S = 50e-6  # the host thread's sleep between reads of a count the stream writes (after a few bare yields)


def _driver_fn(*names: str) -> Callable[..., int] | None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int
            return fn
    return None


@lru_cache(maxsize=1)
def _driver_ops() -> tuple[Callable[..., int], Callable[..., int]] | None:
    """cuStreamWaitValue32 and cuStreamWriteValue32 of the CUDA driver, or None where either is missing."""
    wait = _driver_fn("cuStreamWaitValue32_v2", "cuStreamWaitValue32")
    write = _driver_fn("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
    return (wait, write) if wait is not None and write is not None else None


def reached(value: int, count: int) -> bool:
    """Has a count that started at 0 and wraps at 2**32 reached ``count`` (the driver's GEQ test)?"""
    return (value - count) & _MASK < _HALF


class HostFlag:
    """A 32-bit count in pinned host memory: streams wait on it and a host thread raises it, or a stream writes
    it and a host thread waits for it."""

    def __init__(self) -> None:
        ops = _driver_ops()
        if ops is None:
            raise RuntimeError("the CUDA driver's cuStreamWaitValue32 / cuStreamWriteValue32 are not available")
        self._fn, self._write = ops
        self._flag = torch.zeros(1, dtype=torch.int32).pin_memory()
        self._cell = ctypes.c_uint32.from_address(self._flag.data_ptr())
        self._count = 0

    def next(self) -> int:
        """The count the next wait is for."""
        self._count = (self._count + 1) & _MASK
        return self._count

    def wait(self, count: int, stream: torch.cuda.Stream | None) -> None:
        """Put on ``stream`` a wait until the flag reaches ``count`` (raised before or after: either works)."""
        self._on_stream(self._fn, "cuStreamWaitValue32", stream, count, _GEQ)

    def raise_to(self, count: int) -> None:
        """Release the waits up to ``count`` (an aligned 32-bit store: the GPU sees it whole)."""
        self._cell.value = count

    def write(self, count: int, stream: torch.cuda.Stream) -> None:
        """Put on ``stream`` a write of ``count``, after the stream's earlier work (``host_wait`` sees it)."""
        self._on_stream(self._write, "cuStreamWriteValue32", stream, count, _WRITE_DEFAULT)

    def _on_stream(self, fn: Callable[..., int], name: str, stream: torch.cuda.Stream, count: int, flags: int) -> None:
        """Put the driver's stream memory operation ``fn`` on ``stream`` for this flag's cell and ``count``."""
        rc = fn(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(self._flag.data_ptr()), ctypes.c_uint32(count),
                flags)
        if rc != 0:
            raise RuntimeError(f"{name} failed with CUresult {rc}")

    def seen(self, count: int) -> bool:
        """Has the flag reached ``count`` (``reached``), as this thread reads host memory now?"""
        return reached(self._cell.value, count)

    def host_wait(self, count: int) -> None:
        """Wait on this thread, reading host memory only, until a stream has written ``count`` (or more)."""
        spins = 0
        while not self.seen(count):
            time.sleep(0 if spins < 64 else POLL_S)  # either sleep lets the other threads have the GIL
            spins += 1


class ThreadFlag:
    """``HostFlag`` for a device without streams (the CPU): the caller itself waits until the count is raised."""

    def __init__(self) -> None:
        self._done = threading.Condition()
        self._raised = 0
        self._count = 0

    def next(self) -> int:
        self._count += 1
        return self._count

    def wait(self, count: int, stream: None = None) -> None:
        with self._done:
            self._done.wait_for(lambda: self._raised >= count)

    def raise_to(self, count: int) -> None:
        with self._done:
            self._raised = count
            self._done.notify_all()


def new_flag(device: torch.device) -> HostFlag | ThreadFlag:
    """The flag a split layer on ``device`` waits on."""
    return HostFlag() if device.type == "cuda" else ThreadFlag()


def flag_waits(device: torch.device) -> bool:
    """Whether a stream on ``device`` can wait on a ``HostFlag`` here (tried on a stream of its own: raised
    before the wait, so a working wait ends at once; a broken one leaves only that stream blocked)."""
    if device.type != "cuda":
        return False
    try:
        flag, written = HostFlag(), HostFlag()
        stream = torch.cuda.Stream(device)
        flag.raise_to(flag.next())
        flag.wait(1, stream)
        written.write(written.next(), stream)
        done = torch.cuda.Event()
        done.record(stream)
        deadline = time.perf_counter() + 2.0
        while not (done.query() and written.seen(1)):
            if time.perf_counter() > deadline:
                log.warning("a stream and a host flag did not see each other: the host computes experts in step")
                return False
            time.sleep(0.001)
        return True
    except Exception as exc:  # noqa: BLE001 - any failure means "not here"
        log.debug("stream waits on host flags unavailable: %s", exc)
        return False
