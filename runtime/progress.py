"""Progress of a long apply: a bar on a terminal, a log line every 10% otherwise."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("runtime")

MIN_BYTES = 1 << 30  # report progress only when moving at least this much


class Progress:
    def __init__(self, total: int, what: str, enabled: bool | None = None) -> None:
        self.total, self.done, self.what = total, 0, what
        self.enabled = total >= MIN_BYTES if enabled is None else enabled
        self._bar = None
        self._next_log = 0.1
        self._t0 = time.perf_counter()
        if self.enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, DownloadColumn, Progress as Bar, TransferSpeedColumn

            self._bar = Bar("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                            TransferSpeedColumn(), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(what, total=total)

    def advance(self, n: int) -> None:
        if not self.enabled or n == 0:
            return
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
        elif self.done >= self._next_log * self.total:
            log.info("%s: %.0f%% (%.2f GB in %.1f s)", self.what, 100 * self.done / self.total,
                     self.done / 1e9, time.perf_counter() - self._t0)
            while self._next_log * self.total <= self.done:
                self._next_log += 0.1

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
