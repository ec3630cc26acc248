"""Copies issued inside a CUDA graph capture are joined into it before the capture ends.

One forward is not always one graph. torch.compile's CUDA-graph trees (``mode="reduce-overhead"``,
which transformers' static-cache ``generate()`` uses) capture each compiled region on its own, so a
graph break, or an inductor partition around an op it will not capture, cuts a forward into several
graphs, and a copy issued on the copy stream in one of them may be waited on in the next. CUDA refuses
to end a capture while work forked from it is unjoined ("capturing stream has unjoined work"), and an
event recorded in one capture cannot be waited on in another.

So while a plan is applied, ``torch.cuda.CUDAGraph.capture_end`` first lets every offloader that issued
copies in the capture join its copy stream into the capturing stream (the copies are then part of that
graph and have landed when its replay ends), and those copies count as done: a later graph, replayed
after this one on the same stream, uses them without waiting. Nothing else changes: the wrapper calls
the original ``capture_end``, and the last ``release()`` puts the original back. The cost is overlap
lost at a graph boundary (a copy crossing it no longer overlaps the next graph's first kernels), never
correctness.
"""

from __future__ import annotations

import weakref

_held = 0
_original = None
# offloaders with copies issued in the capture under way (weak: a dropped model must not be kept alive)
_pending: weakref.WeakSet = weakref.WeakSet()


def captured_copies(offloader: object) -> None:
    """``offloader`` issued copies in the current capture: join them before it ends."""
    _pending.add(offloader)


def _capture_end(self, *args, **kwargs):
    for offloader in list(_pending):
        offloader.join_capture()
    _pending.clear()
    return _original(self, *args, **kwargs)


def hold() -> None:
    """One more applied plan: wrap ``CUDAGraph.capture_end`` (once)."""
    global _held, _original
    if _held == 0:
        import torch

        graph_class = torch.cuda.CUDAGraph
        _original = graph_class.capture_end
        graph_class.capture_end = _capture_end
    _held += 1


def release() -> None:
    """One plan fewer: the last one puts the original ``capture_end`` back."""
    global _held, _original
    if _held == 0:
        return
    _held -= 1
    if _held == 0:
        import torch

        torch.cuda.CUDAGraph.capture_end = _original
        _original = None
        _pending.clear()
