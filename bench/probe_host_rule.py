"""The host kernel's rule against each of its two sides, on routed calls (issue 21).

    PYTHONPATH=. python bench/probe_host_rule.py > $OUT/host-rule.jsonl     # the H200's host (about 40 s)
    python bench/probe_host_rule.py --small                                 # tiny shapes (the tests)

``runtime.host_matmul.MAX_PASSES`` sends a host part to the kernel where its touched experts take at most that many
passes of 4 rows on average, else to torch.bmm's padded pass. Here a host part as a split layer holds it (PhiMoE:
9 of 16 experts, top 2; Qwen3-MoE: 64 of 128, top 8), called with fresh random routings at a decode's tokens,
through ``runtime.expert_math.host_rows`` on the backend's host thread three ways: the rule, the kernel at any
passes, torch.bmm always; ms a call (median over the routings, each timed on its second call), the passes the
routings took and how many calls the rule gave the kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import host_matmul  # noqa: E402
from runtime.calibrate_host import _on_host_thread, _Part  # noqa: E402
from runtime.timing import wall_ms  # noqa: E402

# name: (experts in the part, experts in the layer, hidden, width, top k, tokens)
SHAPES = {"phimoe": (9, 16, 4096, 6400, 2, (32,)), "qwen3_moe": (64, 128, 2048, 768, 8, (32, 64))}
SMALL = {"phimoe": (9, 16, 64, 96, 2, (32,)), "qwen3_moe": (16, 32, 64, 32, 8, (8, 16))}
WAYS = {"rule": {}, "kernel": {"MAX_PASSES": math.inf}, "bmm": {"KERNEL": False}}


def probe(shapes: dict, routings: int) -> list[dict]:
    rows = []
    for name, (experts, total, hidden, width, top_k, tokens_list) in shapes.items():
        part = _Part(experts, total, hidden, width, top_k=top_k)
        for tokens in tokens_list:
            calls = [part.call(tokens) for _ in range(routings)]
            passes = [host_matmul.passes(counts) for _, counts in calls]
            for way, settings in WAYS.items():
                kernel_calls = []
                real = host_matmul.grouped_rows
                with contextlib.ExitStack() as stack, torch.no_grad():
                    for attr, value in settings.items():
                        stack.enter_context(mock.patch.object(host_matmul, attr, value))
                    stack.enter_context(mock.patch.object(
                        host_matmul, "grouped_rows", lambda *a, **kw: kernel_calls.append(1) or real(*a, **kw)))
                    times = [wall_ms(run, repeat=1) for run, _ in calls]  # each on its second call
                rows.append({"shape": name, "tokens": tokens, "way": way, "ms": round(statistics.median(times), 3),
                             "ms_each": [round(t, 3) for t in times], "passes": [round(p, 3) for p in passes],
                             "kernel_calls": len(kernel_calls) // 2, "calls": routings * 2,
                             "max_passes": host_matmul.MAX_PASSES})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes (the tests' smoke run)")
    ap.add_argument("--routings", type=int, default=8)
    args = ap.parse_args(argv)
    shapes = SMALL if args.small else SHAPES
    if torch.cuda.is_available():
        _on_host_thread(lambda: probe(shapes, args.routings))
    else:
        probe(shapes, args.routings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
