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
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import host_matmul  # noqa: E402
from runtime.calibrate_host import MODULE_LAYOUT, _Experts, _on_host_thread  # noqa: E402
from runtime.expert_math import host_rows, rows_dtype  # noqa: E402

# name: (experts in the part, experts in the layer, hidden, width, top k, tokens)
SHAPES = {"phimoe": (9, 16, 4096, 6400, 2, (32,)), "qwen3_moe": (64, 128, 2048, 768, 8, (32, 64))}
SMALL = {"phimoe": (9, 16, 64, 96, 2, (32,)), "qwen3_moe": (16, 32, 64, 32, 8, (8, 16))}
WAYS = {"rule": {}, "kernel": {"MAX_PASSES": math.inf}, "bmm": {"KERNEL": False}}


def part(experts: int, hidden: int, width: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """The host's weights of ``experts`` experts, stored as the host stores them ([E, out, in])."""
    layout = MODULE_LAYOUT.for_host()
    up = (torch.randn(experts, 2 * width, hidden, generator=g) / 40).to(torch.bfloat16)
    down = (torch.randn(experts, hidden, width, generator=g) / 40).to(torch.bfloat16)
    return {name: w.transpose(-2, -1).contiguous() if name in MODULE_LAYOUT.flipped(layout) else w
            for name, w in (("gate_up_proj", up), ("down_proj", down))}


def probe(shapes: dict, routings: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    module, layout = _Experts(), MODULE_LAYOUT.for_host()
    rows = []
    for name, (experts, total, hidden, width, top_k, tokens_list) in shapes.items():
        weights = part(experts, hidden, width, g)
        table = torch.full((total,), experts, dtype=torch.long)
        table[:experts] = torch.arange(experts)
        for tokens in tokens_list:
            calls = []
            for _ in range(routings):
                index = torch.rand(tokens, total, generator=g).argsort(dim=-1)[:, :top_k]
                routing = torch.softmax(torch.randn(tokens, top_k, generator=g), -1).to(torch.bfloat16)
                hidden_states = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
                local = index[index < experts]
                counts = torch.bincount(local, minlength=experts)
                calls.append((index, routing, hidden_states, host_matmul.passes(counts)))
            for way, settings in WAYS.items():
                was = {k: getattr(host_matmul, k) for k in settings}
                for k, v in settings.items():
                    setattr(host_matmul, k, v)
                kernel_calls = []
                real = host_matmul.grouped_rows
                host_matmul.grouped_rows = lambda *a, **kw: kernel_calls.append(1) or real(*a, **kw)
                try:
                    times = []
                    for index, routing, hidden_states, _ in calls:
                        def run() -> None:
                            out = torch.zeros(index.numel(), hidden, dtype=rows_dtype(hidden_states, routing))
                            with torch.no_grad():
                                host_rows(module, layout, weights, table, hidden_states, index, routing, out)
                        run()
                        times.append(_timed(run))
                finally:
                    host_matmul.grouped_rows = real
                    for k, v in was.items():
                        setattr(host_matmul, k, v)
                passes = [c[3] for c in calls]
                rows.append({"shape": name, "tokens": tokens, "way": way, "ms": round(statistics.median(times), 3),
                             "ms_each": [round(t, 3) for t in times], "passes": [round(p, 3) for p in passes],
                             "kernel_calls": len(kernel_calls) // 2, "calls": routings * 2,
                             "max_passes": host_matmul.MAX_PASSES})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _timed(run) -> float:
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1e3


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
