"""The host's expert matmuls, and the link, by the pages under the weights (issue 21, decode at batch 32).

    PYTHONPATH=. python bench/probe_host_pages.py > $OUT/host-pages.jsonl      # the H200 machine (about a minute)
    python bench/probe_host_pages.py --small                                    # the tests' smoke run (CPU)

The cpu backend keeps a split layer's host experts in pinned arenas (``runtime.pinned``: an anonymous mapping,
page-locked). On a kernel whose transparent-huge-page mode is ``madvise`` such a mapping gets 4 KiB pages unless it
asks; the host CPU then reads 9.4 MB an expert across 2,300 pages. A forward's host part read 33-45 GB/s on the
H200's host where one bmm over plain tensors read 79 (bench/probe_host_sharing.py, 2026-12-02).

The same host part as calibrate's (64 of 128 Qwen3-MoE experts, ``runtime.calibrate_host._Part``) with its weights
in three kinds of memory: ``plain`` (torch's own tensors), ``pinned 4k`` (a pinned arena, ``runtime.pinned.HUGE_PAGES``
off) and ``pinned huge`` (on). For each, on the backend's host thread (its thread count): one bmm of the gate and
up projections over all 64 experts at 2 rows; the same in batches of 8 experts (the padded pass's runs); the padded
pass itself (``host_rows``) at 32 tokens over fresh routings. On a GPU machine also a copy of the arena to the
GPU and a 1-token matmul reading its gate and up weights in place (UVA). Each row has the huge pages the kernel
gave the weights (``/proc/self/smaps``) and the system's THP settings."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import pinned  # noqa: E402
from runtime.calibrate_host import EXPERTS, HIDDEN, PART, WIDTH, _on_host_thread, _Part  # noqa: E402
from runtime.timing import wall_ms  # noqa: E402


def thp_settings() -> dict[str, str]:
    """The kernel's transparent-huge-page mode and defrag setting (the bracketed choice)."""
    out = {}
    for name in ("enabled", "defrag"):
        try:
            text = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text()
        except OSError:
            continue
        m = re.search(r"\[(\w+)\]", text)
        out[name] = m.group(1) if m else text.strip()
    return out


def huge_kib(start: int, size: int) -> int:
    """KiB of anonymous huge pages in the mappings that overlap [start, start + size) (Linux; 0 elsewhere)."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    total, inside = 0, False
    for line in lines:
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            lo, hi = int(m.group(1), 16), int(m.group(2), 16)
            inside = lo < start + size and hi > start
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def host_rates(part: _Part, repeat: int) -> dict[str, float]:
    """GB/s of the three host passes over ``part``'s weights, on the calling thread."""
    up = part.weights["gate_up_proj"]
    x = torch.randn(up.shape[0], 2, up.shape[-1], dtype=up.dtype)
    up_bytes = up.numel() * up.element_size()

    def span() -> None:
        torch.bmm(x, up.transpose(-2, -1))

    def batches() -> None:
        for s in range(0, up.shape[0], 8):
            torch.bmm(x[s:s + 8], up[s:s + 8].transpose(-2, -1))

    calls = part.calls(32, repeat + 1)
    calls[0][0]()
    times = []
    for run, _, _ in calls[1:]:
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    touched = statistics.mean(b for _, b, _ in calls[1:])
    ms = statistics.median(times)
    return {"bmm_span_gbps": round(up_bytes / wall_ms(span, repeat) / 1e6, 1),
            "bmm_batches_of_8_gbps": round(up_bytes / wall_ms(batches, repeat) / 1e6, 1),
            "padded_pass_32_ms": round(ms, 3), "padded_pass_32_gbps": round(touched / ms / 1e6, 1)}


def link_rates(arena: pinned.HostArena, up: torch.Tensor, device: torch.device) -> dict[str, float]:
    """GB/s of a copy of the arena to the GPU and of a 1-token matmul reading ``up`` in place."""
    from runtime.uva import device_view

    dst = torch.empty(arena.nbytes, dtype=torch.uint8, device=device)
    copy = wall_ms(lambda: dst.copy_(arena.storage, non_blocking=True), repeat=5,
                   sync=lambda: torch.cuda.synchronize(device))
    view = device_view(up.view(-1, up.shape[-1]), device)
    x = torch.randn(1, up.shape[-1], dtype=up.dtype, device=device)
    read = wall_ms(lambda: x @ view.T, repeat=5, sync=lambda: torch.cuda.synchronize(device))
    return {"copy_gbps": round(arena.nbytes / copy / 1e6, 1),
            "uva_read_gbps": round(up.numel() * up.element_size() / read / 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="8 of 16 tiny experts, no GPU (the tests' smoke run)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.small
    device = torch.device("cuda" if cuda else "cpu")
    part = _Part(8, 16, 64, 32) if args.small else _Part(PART, EXPERTS, HIDDEN, WIDTH)
    plain = dict(part.weights)
    print(json.dumps({"thp": thp_settings(), "torch": torch.__version__, "cuda": cuda}), flush=True)
    kinds = [("plain", None), ("pinned 4k", False), ("pinned huge", True)]
    for rounds in range(1 if args.small else 2):
        for kind, huge in kinds:
            arena = None
            if huge is not None:
                was = pinned.HUGE_PAGES
                pinned.HUGE_PAGES = huge
                try:
                    arena, views = pinned.pack(list(plain.values()), pin=cuda)
                finally:
                    pinned.HUGE_PAGES = was
                part.weights = dict(zip(plain, views))
            else:
                part.weights = dict(plain)
            spans = [(t.data_ptr(), t.numel() * t.element_size()) for t in part.weights.values()]
            huge_mb = (huge_kib(arena.storage.data_ptr(), arena.nbytes) if arena is not None
                       else sum(huge_kib(start, size) for start, size in spans)) / 1024
            row = {"round": rounds, "memory": kind, "advised": bool(arena is not None and arena.huge),
                   "weights_mb": round(sum(size for _, size in spans) / 1e6, 1), "huge_mb": round(huge_mb, 1)}
            row |= _on_host_thread(lambda: host_rates(part, args.repeat)) if cuda else host_rates(part, args.repeat)
            if cuda and arena is not None:
                row |= link_rates(arena, part.weights["gate_up_proj"], device)
            print(json.dumps(row), flush=True)
            part.weights = dict(plain)
            if arena is not None:
                arena.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
