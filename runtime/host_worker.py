"""The host's thread of the cpu backend: one thread an applied plan that computes the host's experts of every split
layer in call order, on every CPU of the process but the one left to the thread issuing the forward
(runtime/cpu_experts.py submits to it; runtime/calibrate_host.py times the host's part on one, as the runtime runs
it)."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

import torch

from runtime.errors import ApplyError

CPU_BACKEND = "the cpu backend (plan layers whose experts.cpu lists experts the host computes)"


def host_threads() -> int:
    """The threads the host's expert kernels use: every CPU this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class HostWorker:
    """The thread that computes the host's experts of every split layer of one applied plan, in call order."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.error: BaseException | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="host-experts", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        torch.set_num_threads(self.threads)  # this thread's team; the caller's setting is restored at remove
        while (job := self._jobs.get()) is not None:
            job()

    def check(self) -> None:
        """Raise the first error a job met (once)."""
        if self.error is not None:
            error, self.error = self.error, None
            raise ApplyError(f"the host's part of a split experts layer failed ({CPU_BACKEND}): {error!r}") from error

    def close(self) -> None:
        """Finish the jobs queued (each waits for the GPU only) and end the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
