"""Time per generated token: a transformers logits processor that marks when each step's logits are ready.

    clock = TokenClock(device, progress=True)
    model.generate(ids, ..., logits_processor=LogitsProcessorList([clock]))
    clock.ms_per_token()    # median interval between consecutive steps, after the first few

On CUDA each mark is an event on the current stream, so nothing in the decode loop waits for the GPU (the
intervals measure what the GPU and the CPU together sustain); on the CPU it is the host clock. The first
``skip`` intervals are left out of the median: with transformers' static cache they compile, warm up and
record the CUDA graphs. ``progress`` shows a bar over the tokens on a terminal.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch


class TokenClock:
    def __init__(self, device: torch.device | str, total: int | None = None, progress: bool = False,
                 skip: int = 8) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.skip = skip
        self.marks: list = []
        self._bar = None
        if progress and total and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._bar = Progress("generating", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 transient=True)
            self._bar.start()
            self._task = self._bar.add_task("tokens", total=total)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        if self._bar is not None:
            self._bar.advance(self._task)
        return scores

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def intervals_ms(self) -> list[float]:
        """Milliseconds between consecutive steps (synchronizes the device once)."""
        self.close()
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]

    def ms_per_token(self) -> float | None:
        """The median interval after the first ``skip`` (all of them when there are no more); None for < 2 marks."""
        steps = self.intervals_ms()
        timed = steps[self.skip:] or steps
        return statistics.median(timed) if timed else None
