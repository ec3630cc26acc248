"""The host's padded pass by how it groups touched experts into batched matmuls (issue 21, decode at batch 32).

    PYTHONPATH=. python bench/probe_host_runs.py > $OUT/host-runs.jsonl      # the H200's host

``runtime.expert_math._padded_rows`` ran one torch.bmm a projection per run of consecutive touched experts, so
that no untouched expert was read. At 32 tokens (top-8 of 128) about 7 in 8 experts are touched and the runs are
about 8 experts long; on 2026-12-02 the host read 79 GB/s in one bmm over 64 experts at 2 rows while a forward's
host part read 33-45 (bench/probe_host_sharing.py). Here the same host part as calibrate's (64 of 128
Qwen3-MoE experts, ``runtime.calibrate_host._Part``), the same routings, four groupings: ``runs`` (each run apart:
``_runs(counts, 0)``), ``eighth`` (the runtime's default since 2026-12-02: joined while the untouched experts a
batch reads stay at most ``JOIN_WASTE``, an eighth, of its touched ones), ``gaps2`` (runs joined across gaps of at
most 2 untouched experts, which are then read too) and ``span`` (one run from the first touched expert to the
last). Per grouping: ms a call (median), the touched experts' bytes and the bytes read per ms. The groupings are the
torch.bmm pass's: the probe turns runtime/host_matmul.py's kernel (which reads the touched experts alone) off."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import expert_math, host_matmul  # noqa: E402
from runtime.calibrate_host import EXPERTS, HIDDEN, PART, WIDTH, _Part  # noqa: E402

TODAY = expert_math._runs


def runs(counts: list[int]) -> list[tuple[int, int]]:
    return TODAY(counts, 0.0)


def joined(gap: int):
    def batches(counts: list[int]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for s, e in runs(counts):
            if out and s - out[-1][1] <= gap:
                out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
        return out
    return batches


GROUPINGS = {"runs": runs, "eighth": TODAY, "gaps2": joined(2), "span": joined(1 << 30)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="8 of 16 tiny experts (the tests' smoke run)")
    args = ap.parse_args(argv)
    kernel, host_matmul.KERNEL = host_matmul.KERNEL, False
    try:
        return _probe(args)
    finally:
        host_matmul.KERNEL = kernel


def _probe(args: argparse.Namespace) -> int:
    part = _Part(8, 16, 64, 32) if args.small else _Part(PART, EXPERTS, HIDDEN, WIDTH)
    for tokens in (1, 8) if args.small else (1, 8, 32, 64):
        calls = part.calls(tokens, 8)
        read_experts: dict[str, list[int]] = {}
        for name, grouping in GROUPINGS.items():
            seen: list[int] = []

            def counting(counts, grouping=grouping, seen=seen):
                runs = grouping(counts)
                seen.append(sum(e - s for s, e in runs))
                return runs

            expert_math._runs = counting
            try:
                calls[0][0]()
                times = []
                for run, _, _ in calls:
                    t0 = time.perf_counter()
                    run()
                    times.append((time.perf_counter() - t0) * 1e3)
            finally:
                expert_math._runs = TODAY
            read_experts[name] = seen[1:]
            touched = statistics.mean(b for _, b, _ in calls) / part.per_expert
            ms = statistics.median(times)
            read = statistics.mean(seen[1:])
            print(json.dumps({"tokens": tokens, "grouping": name, "ms": round(ms, 3), "touched": round(touched, 1),
                              "read_experts": round(read, 1),
                              "touched_gbps": round(touched * part.per_expert / ms / 1e6, 1),
                              "read_gbps": round(read * part.per_expert / ms / 1e6, 1),
                              "threads": torch.get_num_threads()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
