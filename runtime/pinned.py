"""Exact-size pinned host memory.

PyTorch's caching host allocator (``pin_memory()``, ``torch.empty(pin_memory=True)``)
rounds every block up to a power of two, which can nearly double the host memory an
offloader needs. Instead we allocate ordinary host memory of the exact size and
page-lock it with ``cudaHostRegister``: one registration per offloaded layer (its
params packed at 256-byte aligned offsets), released again by ``close()``.

Without CUDA (CPU-only machines, CI) the arena is plain host memory: the same
layout and bookkeeping, no page locking.

A pinned arena asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``, before its
pages are touched) where ``HUGE_PAGES`` is set: on a kernel whose THP mode is ``madvise`` an anonymous
mapping otherwise gets 4 KiB pages. Measured on the H200 machine (2026-12-03, bench/probe_host_pages.py and
bench_moe_hybrid.py --host-pages): the host's expert matmuls over a split layer 8% faster, a plan applied in
3.3-3.5 s instead of 5.3-6.8 (fewer pages to lock), copies and UVA reads unchanged. The arena's size and
layout do not change (a huge page the kernel cannot find stays 4 KiB pages).
"""

from __future__ import annotations

import logging
import mmap
import warnings
import weakref

import torch

from runtime.cudart import clear_last_error
from runtime.tensors import span_elements

log = logging.getLogger("runtime")

ALIGN = 256  # bytes; keeps every param's start aligned for vectorised copies and kernels
PAGE = 4096  # arenas are page-aligned whole pages, so no two registrations ever share a page
HUGE_PAGES = True  # pinned arenas advise the kernel to back them with transparent huge pages
_REGISTER_PORTABLE_MAPPED = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class HostArena:
    """One block of host memory holding several tensors, page-locked when CUDA is present."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.nbytes = nbytes
        self.registered = False
        self.pinned = False
        self.huge = False  # huge pages were advised (the kernel may still give 4 KiB pages)
        if not (pin and nbytes > 0):
            self.storage = torch.empty(max(nbytes, 1), dtype=torch.uint8)
            return
        size = (nbytes + PAGE - 1) // PAGE * PAGE
        # anonymous mmap: page-aligned pages of our own, so the tensor's storage starts exactly
        # where the registration does (torch's is_pinned() looks at the storage's start)
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.huge = HUGE_PAGES and advise_huge_pages(self._map)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # frombuffer warns that the buffer is shared: intended
            self.storage = torch.frombuffer(self._map, dtype=torch.uint8)
        self.nbytes = size
        rc = int(torch.cuda.cudart().cudaHostRegister(self.storage.data_ptr(), size, _REGISTER_PORTABLE_MAPPED))
        if rc == 0:
            self.registered = self.pinned = True
            # unregister even if close() is never called, before the memory goes back to malloc
            self._finalizer = weakref.finalize(self, _unregister, self.storage)
            return
        clear_last_error()  # a failed runtime call leaves an error that the next kernel launch would report
        log.warning("cudaHostRegister failed (CUDA error %d) for %d bytes; falling back to pin_memory(), "
                    "which rounds the block up to a power of two", rc, size)
        self.storage = self.storage.pin_memory()
        self.pinned = True

    def view(self, offset: int, like: torch.Tensor) -> torch.Tensor:
        """A tensor with ``like``'s shape, stride and dtype at ``offset`` bytes into the arena."""
        span = span_elements(like)
        flat = self.storage[offset: offset + span * like.element_size()].view(like.dtype)
        return flat.as_strided(like.shape, like.stride())

    def close(self) -> None:
        if self.registered:
            self._finalizer.detach()
            rc = _unregister(self.storage)
            if rc != 0:
                raise RuntimeError(f"cudaHostUnregister failed with CUDA error {rc}")
            self.registered = False
        self.pinned = False
        self.huge = False
        self.storage = torch.empty(0, dtype=torch.uint8)


def advise_huge_pages(region: mmap.mmap) -> bool:
    """Advise transparent huge pages for ``region`` (untouched yet); False where the platform has no such advice
    or the kernel refuses it (THP off, or not built in)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or not hasattr(region, "madvise"):
        return False
    try:
        region.madvise(advice)
    except OSError:
        return False
    return True


def _unregister(storage: torch.Tensor) -> int:
    return int(torch.cuda.cudart().cudaHostUnregister(storage.data_ptr()))


def pack(tensors: list[torch.Tensor], pin: bool) -> tuple[HostArena, list[torch.Tensor]]:
    """Copy ``tensors`` into one new arena; return it and a host view per tensor (same strides).

    Only the elements each tensor spans are copied; strides are kept, so a
    non-contiguous param comes back exactly as it was.
    """
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += aligned(span_elements(t) * t.element_size())
    arena = HostArena(total, pin)
    views = []
    for t, off in zip(tensors, offsets):
        v = arena.view(off, t)
        v.copy_(t)  # synchronous device->host (or host->host) copy
        views.append(v)
    return arena, views
