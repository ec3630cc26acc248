"""The two CUDA runtime calls PyTorch does not expose: an async host->device memcpy and
cudaGetLastError, called through ctypes on the libcudart PyTorch has already loaded.

Why our own memcpy: PyTorch's ``copy_`` refuses, during CUDA graph capture, host memory it
did not pin itself, and our exact-size host memory is pinned with ``cudaHostRegister``.
The copy is the same ``cudaMemcpyAsync`` either way; calling it directly also keeps the hot
path to one C call per param, with every pointer and size computed at apply time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import lru_cache

_HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL | None:
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libcudart" in line})
    except OSError:
        pass
    found = ctypes.util.find_library("cudart")
    for path in paths + ([found] if found else []):
        try:
            lib = ctypes.CDLL(path)
            lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                            ctypes.c_void_p]
            lib.cudaMemcpyAsync.restype = ctypes.c_int
            lib.cudaGetLastError.restype = ctypes.c_int
            return lib
        except (OSError, AttributeError):
            continue
    return None


def available() -> bool:
    return _lib() is not None


def h2d_copier() -> Callable[[int, int, int, int], None]:
    """``copy(dst, src, nbytes, stream)``: an async host->device cudaMemcpyAsync on ``stream`` (a stream handle),
    with the library function looked up now, once (the prefetch offloader binds it at apply)."""
    call = _lib().cudaMemcpyAsync

    def copy(dst: int, src: int, nbytes: int, stream: int) -> None:
        rc = call(dst, src, nbytes, _HOST_TO_DEVICE, stream)
        if rc != 0:
            raise RuntimeError(f"cudaMemcpyAsync of {nbytes} bytes failed with CUDA error {rc}")

    return copy


def memcpy_h2d_async(dst: int, src: int, nbytes: int, stream: int) -> None:
    h2d_copier()(dst, src, nbytes, stream)


def clear_last_error() -> None:
    lib = _lib()
    if lib is not None:
        lib.cudaGetLastError()
