"""The host's batched matmuls by the rows each expert is padded to, and the host part's phases (issue 21).

    PYTHONPATH=. python bench/probe_host_rows_m.py > $OUT/host-rows-m.jsonl      # the H200's host (about a minute)
    python bench/probe_host_rows_m.py --small                                     # tiny shapes (the tests)

At decode 32 a forward's host part reads its experts at 33-45 GB/s where one torch.bmm over 64 Qwen3-MoE experts'
gate and up projections at 2 rows reads 79 (bench/probe_host_sharing.py, 2026-12-02); calibrate's host part took
14.05 ms at 32 tokens (about 7 rows an expert after padding) and 9.84 ms at 64 tokens (about 10), more bytes in
less time (bench/probe_host_runs.py, 2026-12-02). Does oneDNN's batched kernel slow down at some row counts?
On the backend's host thread (``HostWorker``, every CPU but one), rows:

- ``bmm``: each projection alone over 64 experts (gate/up in the module's layout read transposed, as the runtime
  holds it; ``gate_up_host``: the same weights stored [E, H, 2I]; ``down``: [E, H, I] read transposed, the host's
  layout since this probe; ``down_in_out``: [E, I, H], the host's layout before it) at M rows an expert, GB/s of
  weights;
- ``bmm`` also runs ``gate_up_kernel`` and ``down_kernel``: the same projections through runtime/host_matmul.py's
  kernel (the host's part since 2026-12-03, where it builds);
- ``host_rows``: calibrate's host part (64 of 128 experts) at 32 and 64 tokens with the padded pass's rows rounded
  up to a multiple of ``PAD`` (``runtime.expert_math.PAD_ROWS``) through torch.bmm, and through the kernel
  (``kernel``), ms a call (median of 6 routings, each timed on its second call);
- ``threads``: the same host part at 32 tokens on fewer threads;
- ``loop``: the 64 experts one at a time at M rows each (gate/up, the gate, down): ``plain`` with torch's linear on
  the weights as they are (oneDNN packs a weight into its blocked layout at every call), ``packed`` on weights
  packed once (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's CPU freezing does), GB/s of weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import expert_math, host_matmul  # noqa: E402
from runtime.calibrate_host import EXPERTS, HIDDEN, PART, WIDTH, _on_host_thread, _Part  # noqa: E402
from runtime.timing import wall_ms  # noqa: E402

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)
PADS = (1, 4, 8, 16, 32)


def bmm_rows(experts: int, hidden: int, width: int, rows: tuple[int, ...]) -> list[dict]:
    gate_up = torch.randn(experts, 2 * width, hidden).to(torch.bfloat16)  # [E, 2I, H]: the module's layout
    gate_up_host = gate_up.transpose(1, 2).contiguous()  # [E, H, 2I]
    down = torch.randn(experts, hidden, width).to(torch.bfloat16)  # [E, H, I]: the module's and the host's layout
    down_in_out = down.transpose(1, 2).contiguous()  # [E, I, H]: the host's layout until 2026-12-03
    out = []
    for m in rows:
        x = torch.randn(experts, m, hidden).to(torch.bfloat16)
        a = torch.randn(experts, m, width).to(torch.bfloat16)
        ids, seen = torch.arange(experts), torch.full((experts,), m)
        for name, fn, nbytes in (("gate_up", lambda: torch.bmm(x, gate_up.transpose(1, 2)), gate_up.nbytes),
                                 ("gate_up_host", lambda: torch.bmm(x, gate_up_host), gate_up.nbytes),
                                 ("down", lambda: torch.bmm(a, down.transpose(1, 2)), down.nbytes),
                                 ("down_in_out", lambda: torch.bmm(a, down_in_out), down.nbytes),
                                 ("gate_up_kernel", lambda: host_matmul.grouped_rows(x, gate_up, ids, seen),
                                  gate_up.nbytes),
                                 ("down_kernel", lambda: host_matmul.grouped_rows(a, down, ids, seen), down.nbytes)):
            if name.endswith("_kernel") and host_matmul.library() is None:
                continue
            ms = wall_ms(fn, 8)
            out.append({"case": "bmm", "proj": name, "rows": m, "ms": round(ms, 3),
                        "gbps": round(nbytes / ms / 1e6, 1), "threads": torch.get_num_threads()})
    return out


def packs_bf16() -> bool:
    """Whether oneDNN packs bf16 weights on this CPU (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(2, 2, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


def expert_loop(experts: int, hidden: int, width: int, rows: tuple[int, ...]) -> list[dict]:
    """The plain per-expert loop and, where the CPU packs bf16 weights (``packs_bf16``), the packed one."""
    gate_up = [torch.randn(2 * width, hidden).to(torch.bfloat16) for _ in range(experts)]
    down = [torch.randn(hidden, width).to(torch.bfloat16) for _ in range(experts)]  # nn.Linear's [out, in]
    nbytes = sum(w.nbytes for w in gate_up + down)
    out = []
    kernels = ("plain", "packed") if packs_bf16() else ("plain",)
    for m in rows:
        pack = torch.ops.mkldnn._reorder_linear_weight if "packed" in kernels else None
        packed_up = [pack(w, m) for w in gate_up] if pack else []
        packed_down = [pack(w, m) for w in down] if pack else []
        x = [torch.randn(m, hidden).to(torch.bfloat16) for _ in range(experts)]

        def plain() -> None:
            for e in range(experts):
                g, u = torch.nn.functional.linear(x[e], gate_up[e]).chunk(2, dim=-1)
                torch.nn.functional.linear(torch.nn.functional.silu(g) * u, down[e])

        def packed() -> None:
            for e in range(experts):
                g, u = torch.ops.mkldnn._linear_pointwise(x[e], packed_up[e], None, "none", [], "").chunk(2, dim=-1)
                torch.ops.mkldnn._linear_pointwise(torch.nn.functional.silu(g) * u, packed_down[e], None, "none", [], "")

        for name, fn in (("plain", plain), ("packed", packed)):
            if name not in kernels:
                continue
            ms = wall_ms(fn, 4)
            out.append({"case": "loop", "kernel": name, "rows": m, "ms": round(ms, 3),
                        "gbps": round(nbytes / ms / 1e6, 1), "threads": torch.get_num_threads()})
    return out


def host_part(part: _Part, tokens: tuple[int, ...], pads: tuple[int, ...], threads: tuple[int, ...]) -> list[dict]:
    out = []
    default, kernel_was = expert_math.PAD_ROWS, host_matmul.KERNEL
    try:
        for t in tokens:
            calls = part.calls(t, 6)
            touched = statistics.mean(b for _, b, _ in calls) / part.per_expert
            for pad, kernel in [(p, False) for p in pads] + [(1, True)] * (host_matmul.library() is not None):
                expert_math.PAD_ROWS = pad
                host_matmul.KERNEL = kernel
                ms = statistics.median(wall_ms(run, 1) for run, _, _ in calls)  # each routing run twice, timed once
                out.append({"case": "host_rows", "tokens": t, "pad": pad, "kernel": kernel, "ms": round(ms, 3),
                            "touched": round(touched, 1),
                            "touched_gbps": round(touched * part.per_expert / ms / 1e6, 1),
                            "threads": torch.get_num_threads()})
        expert_math.PAD_ROWS, host_matmul.KERNEL = default, kernel_was
        mine = torch.get_num_threads()
        calls = part.calls(32, 6)
        for n in threads:
            torch.set_num_threads(n)
            ms = statistics.median(wall_ms(run, 1) for run, _, _ in calls)
            out.append({"case": "threads", "tokens": 32, "threads": n, "ms": round(ms, 3)})
        torch.set_num_threads(mine)
    finally:
        expert_math.PAD_ROWS = default
        host_matmul.KERNEL = kernel_was
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes (the tests' smoke run)")
    ap.add_argument("--only", choices=["bmm", "host_rows", "loop"], action="append",
                    help="measure these cases only (host_rows brings threads)")
    ap.add_argument("--rows", type=int, action="append", help="the rows an expert sees in bmm (default: 1-32)")
    args = ap.parse_args(argv)
    only = set(args.only or ["bmm", "host_rows", "loop"])
    small = args.small
    experts, hidden, width = (4, 64, 32) if small else (PART, HIDDEN, WIDTH)

    def probe() -> list[dict]:
        rows: list[dict] = []
        if "bmm" in only:
            rows += bmm_rows(experts, hidden, width, tuple(args.rows or ((1, 7) if small else ROWS)))
        if "host_rows" in only:
            cores = torch.get_num_threads()
            rows += (host_part(_Part(8, 16, 64, 32), (8,), (1, 16), (1,)) if small else host_part(
                _Part(PART, EXPERTS, HIDDEN, WIDTH), (32, 64), PADS,
                tuple(sorted({cores, max(1, cores * 3 // 4), max(1, cores // 2)}))))
        if "loop" in only:
            rows += expert_loop(experts, hidden, width, (2,) if small else (1, 2, 4, 8))
        return rows

    rows = _on_host_thread(probe) if torch.cuda.is_available() else probe()
    for row in rows:
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
