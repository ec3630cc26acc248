"""The host's grouped bf16 matmul at few rows an expert: a small C kernel built on the machine that runs it.

At decode a routed expert the host computes sees a few rows (32 tokens of top-8 over 128 experts: about 2), so
its part is bound by reading the experts' weights. torch.bmm (oneDNN's AMX kernel on the H200's host) read 64
Qwen3-MoE experts at 43-77 GB/s at 1-4 rows an expert, its tiles made for tall inputs; ``host_matmul.c`` read them
at 68-99 (bench/probe_host_kernel.py, 2026-12-03). It reads each weight row once and uses it for every row of its
expert (several weight rows at once, several streams from memory a thread), widening bf16 to float32 exactly and
summing in float32, one rounding to bf16 at the end as a bf16 matmul rounds (its sums are added in another order
than oneDNN's: the rows can differ in the last bf16 bit, as two GPU kernels' do). It also reads only the touched
experts (``ids``), with no batch spanning untouched ones.

Built with the machine's C compiler (``cc -O3 -march=native -fopenmp``: the host's own vector instructions, fused
multiply-adds) when a plan with host experts is applied (or at first use), into a cache keyed by the source, the
flags, the compiler and the CPU, and loaded with ctypes (which lets go of the GIL during the call). Where there is no
compiler, or the build fails, ``library()`` is None and the host's part runs torch.bmm as before (said once in the
log). ``KERNEL`` (or the environment's ``OFFLOAD_PLANNER_HOST_KERNEL=0``) turns it off, for side-by-side
measurements.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger("runtime")

SOURCE = Path(__file__).with_name("host_matmul.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=gnu11", "-shared", "-fPIC")
KERNEL = os.environ.get("OFFLOAD_PLANNER_HOST_KERNEL", "1") != "0"
"""Whether the host's part uses the kernel (where it builds); False: torch.bmm, as before it."""
DEFINES: tuple[str, ...] = ()
"""Extra ``-D`` defines of the build ``library()`` loads (the source's defaults: none); the probes measure others."""
ROW_BLOCK = 4
"""The rows the kernel takes together on a block of weight rows (``ROWS`` in host_matmul.c): an expert seeing r rows
takes ceil(r / 4) passes over its weights' block."""
MAX_PASSES = 1.65
"""The most passes of ``ROW_BLOCK`` rows the touched experts of a call may take on average for the kernel;
torch.bmm's padded pass above it. The kernel is at its best at one pass (up to 4 rows an expert: decode), and a
second pass costs about half a first; oneDNN's batched kernel reads at a rate about flat in the rows. On the H200's
host (bench/probe_host_rows_m.py, 64 Qwen3-MoE experts, gate/up and down, GB/s of weights, kernel against
torch.bmm, every expert the same rows): 116 / 96 against 95 / 104 at 1 row, 112 / 88 against 85 / 85 at 2, 65 / 49
against 72 / 92 at 8, 37 / 29 against 72 / 75 at 16 (2026-12-03, call j); 92 / 74 against 67 / 62 at 3, 95 / 73
against 68 / 66 at 4, 63 / 51 against 68 / 56 at 5, 63 / 50 against 66 / 63 at 6 (2026-12-04, call c). The two
meet at about 1.65 passes (1.8 for gate/up, 1.4 for down, weighted by their bytes): the bound. PhiMoE at decode
32 (about 4 rows an expert, some 5-8: 1.2-1.6 passes with uniform routing) ran its host part in 18.2-20.3 ms a
layer through the kernel against 25.0-27.3 through torch.bmm, side by side in one run (call c)."""


def passes(counts: torch.Tensor) -> float:
    """The passes of ``ROW_BLOCK`` rows a touched expert takes on average, from the rows each expert sees."""
    touched = int((counts > 0).sum())
    return int(counts.add(ROW_BLOCK - 1).div(ROW_BLOCK, rounding_mode="floor").sum()) / max(1, touched)


BLOCK = 16
"""Output rows of one expert a thread takes at a time."""


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(lines))


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "offload-planner"


def _build(cc: str, flags: tuple[str, ...]) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *flags, cc, version, _cpu_id()]).encode()).hexdigest()[:16]
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / "offload-planner"):
        lib = folder / f"host_matmul-{key}.so"
        if lib.exists():
            return lib
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
        except OSError:
            continue
        done = subprocess.run([cc, *flags, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(done.stderr.strip()[-2000:] or f"{cc} exited {done.returncode}")
        os.replace(tmp, lib)  # whole or not at all, for another process building the same
        return lib
    raise RuntimeError("no writable cache folder for the built kernel")


def build(defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The kernel built (or found in the cache) with these extra ``-D`` defines (the probes' variants) and loaded.
    Raises RuntimeError (no compiler, or the build failed) or OSError (not loadable)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler found (cc, gcc or $CC)")
    lib = ctypes.CDLL(str(_build(cc, FLAGS + tuple(f"-D{d}" for d in defines))))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.grouped_rows.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, i64, ptr, ptr, ptr, ctypes.c_int, i64]
    lib.grouped_rows.restype = None
    return lib


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernel, or None (no compiler, or its build failed: logged once)."""
    try:
        return build(DEFINES)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("host matmul kernel not built (%s); the host's experts run torch.bmm", exc)
        return None


def usable(x: torch.Tensor, w: torch.Tensor, transposed: bool, mean_passes: float) -> bool:
    """Whether ``grouped_rows`` computes ``x``'s rows through ``w`` ([E, out, in], each row's values contiguous):
    bf16 both, on the host, at most ``MAX_PASSES`` passes a touched expert on average (``mean_passes``, from
    ``passes()``; faster than torch.bmm there), no gradient asked for (the kernel has no backward), and the kernel
    built."""
    return (KERNEL and not transposed and mean_passes <= MAX_PASSES and x.dtype == torch.bfloat16
            and w.dtype == torch.bfloat16
            and x.device.type == "cpu" and w.device.type == "cpu" and w.dim() == 3 and w.stride(-1) == 1
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)) and library() is not None)


def grouped_rows(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                 lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """[B, M, N] bf16: ``x[b, :rows[b]] @ w[ids[b]].T``, the rows past ``rows[b]`` zero. ``x`` [B, M, K] (bf16 or
    float32), ``w`` [E, N, K] bf16 (``usable``), ``ids`` and ``rows`` [B] int64. Uses torch's intra-op threads;
    ``lib``: a variant from ``build`` (default ``library()``)."""
    lib = lib or library()
    x = x.to(torch.float32).contiguous()
    ids = ids.to(torch.int64).contiguous()
    rows = rows.to(torch.int64).contiguous()
    b, m, k = x.shape
    n = w.shape[1]
    if w.shape[2] != k or ids.numel() != b or rows.numel() != b:
        raise ValueError(f"grouped_rows: x {tuple(x.shape)}, w {tuple(w.shape)}, ids {ids.numel()}, rows "
                         f"{rows.numel()} do not agree")
    if b and (int(ids.min()) < 0 or int(ids.max()) >= w.shape[0]):
        raise ValueError(f"grouped_rows: expert ids {int(ids.min())}..{int(ids.max())} outside w's "
                         f"{w.shape[0]} experts")
    y = torch.empty((b, m, n), dtype=torch.bfloat16)
    if b:
        lib.grouped_rows(x.data_ptr(), b, m, k, w.data_ptr(), w.stride(0), w.stride(1), n, ids.data_ptr(),
                         rows.data_ptr(), y.data_ptr(), torch.get_num_threads(), BLOCK)
    return y
