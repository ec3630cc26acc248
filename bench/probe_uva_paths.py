"""Two grouped paths over the same UVA experts (issue 17): transformers' experts module forward against the
runtime's own (``runtime.expert_math.part_rows`` then ``join_rows``, what a split layer's GPU parts run).

    PYTHONPATH=. python bench/probe_uva_paths.py > $OUT/uva-paths.jsonl        # the H200
    PYTHONPATH=. python bench/probe_uva_paths.py --device cpu --small --tokens 4 64   # the arithmetic only, any machine

Why: on the H200 (bench/results/predict-h200-2026-12-02d/), MoE prefills whose experts transformers' module reads
through UVA took 1.26-1.33x their link bound, and those whose experts the runtime's path reads through UVA (the
cpu backend's prefills) 0.96-1.29x. Here one Qwen3-MoE experts module (128 experts, hidden 2,048, width 768,
top-8), weights resident and then read through UVA (pinned host memory), at each token count with uniform random
routing: each path's time (CUDA events, median of 5), the bytes read once at the UVA rate measured on the same
weights, and the two paths' outputs compared (they must agree to the rounding of the grouped kernel).

A third path: the runtime's with the host's layout (``Layout.for_host``: until 2026-12-03 down weights stored
[E, I, H], read untransposed), which a split layer's cpu experts keep and which GPU kernels read through UVA above
``cpu_max_tokens``. On 2026-12-02 (17:21, bench/results/predict-h200-2026-12-02o) such layers' prefills ran about
1.5x faster than the cost model's UVA passes say, where layers read through transformers' module were predicted
within 3%: is it the layout? (No: the three took the same time, bench/results/probes-h200-2026-12-02r/.)

``--skew`` and ``--chunks`` found the cause: torch's grouped matmul tiles a call by its rows over its groups, and
a split layer's parts are calls over fewer experts (schemas/grouped_tiles.py). Since then the runtime's own path
pads a call of 64-128 rows an expert to the tall tiles, so ``runtime`` here is faster than ``transformers`` at
2,048 tokens of top-8 of 128 (rows measured before that change compare the two unpadded)."""
from __future__ import annotations

import argparse
import json

import torch

from runtime.calibrate import gpu_ms
from runtime.timing import wall_ms


def timed_ms(fn, device: torch.device, repeat: int = 5) -> float:
    """Median ms of ``fn`` after one warm-up: calibrate's CUDA-event timer on a GPU, the wall clock elsewhere."""
    if device.type == "cuda":
        return gpu_ms(fn, repeat=repeat, warmup=1)
    return wall_ms(fn, repeat, warmup=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 512, 2048])
    ap.add_argument("--small", action="store_true", help="a small module (16 experts, hidden 256): a quick check")
    ap.add_argument("--skew", type=float, nargs="+", default=[0.0],
                    help="routing laws: expert e picked with weight 1/(e+1)^s, top-k distinct a token (0: uniform)")
    ap.add_argument("--chunks", type=int, nargs="*", default=[],
                    help="also the runtime's path cut into this many runs of experts, one grouped call each over "
                         "every pair's row (a split layer's parts; their weights read in place)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)

    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from runtime.calibrate import _uniform_routing, tiny_moe
    from runtime.expert_math import Layout, join_rows, part_rows
    from runtime.uva import device_view

    experts_n, top_k, hidden, width = (16, 4, 256, 128) if args.small else (128, 8, 2048, 768)
    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=width, num_experts=experts_n,
                            num_experts_per_tok=top_k)
    config._experts_implementation = getattr(tiny_moe(1).config, "_experts_implementation", None)
    module = Qwen3MoeExperts(config)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(p.numel()))
    module = module.to(device, torch.bfloat16).eval()
    layout = Layout.of(module)
    params = dict(module.named_parameters())
    total = sum(p.numel() * p.element_size() for p in params.values())
    resident = {n: p.data for n, p in params.items()}
    on_host = {n: p.detach().cpu().pin_memory() if device.type == "cuda" else p.detach().clone()
               for n, p in params.items()}
    uva = {n: device_view(t, device) if device.type == "cuda" else t for n, t in on_host.items()}
    host_layout = layout.for_host()
    flipped = layout.flipped(host_layout)  # stored transposed in the host's layout
    on_host_t = {n: t.transpose(-2, -1).contiguous() if n in flipped else t for n, t in on_host.items()}
    if device.type == "cuda":
        on_host_t = {n: t if t.is_pinned() else t.pin_memory() for n, t in on_host_t.items()}
    uva_t = {n: device_view(t, device) if device.type == "cuda" else t for n, t in on_host_t.items()}
    table = torch.arange(experts_n, device=device)
    uva_gbps = None
    if device.type == "cuda":  # the link's rate on these very weights: one read of every byte by a copy kernel
        flat = [t.view(-1) for t in uva.values()]
        copy_ms = timed_ms(lambda: [f.clone() for f in flat], device)
        uva_gbps = total / copy_ms / 1e6
        print(json.dumps({"kind": "link", "bytes": total, "uva_copy_ms": round(copy_ms, 3),
                          "uva_gbps": round(uva_gbps, 2)}), flush=True)
    g = torch.Generator().manual_seed(3)
    for skew, tokens in ((s, t) for s in args.skew for t in args.tokens):
        if skew:
            law = 1.0 / torch.arange(1, experts_n + 1, dtype=torch.float64) ** skew
            index = torch.multinomial(law.expand(tokens, experts_n), top_k, replacement=False, generator=g).to(device)
        else:
            index = _uniform_routing(experts_n, top_k, tokens, g).to(device)
        weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1).to(device, torch.bfloat16)
        x = torch.randn(tokens, hidden, generator=g).to(device, torch.bfloat16)
        touched = int(torch.unique(index).numel())
        row = {"kind": "paths", "skew": skew, "tokens": tokens, "touched": touched,
               "rows_an_expert": round(tokens * top_k / touched, 2)}
        outs = {}
        for where, tensors in (("resident", resident), ("uva", uva)):
            for n, p in params.items():
                p.data = tensors[n]
            with torch.inference_mode():
                def theirs():
                    return module(x, index, weights)

                def ours():
                    rows = part_rows(module, layout, {n: tensors[n] for n in layout.names}, table, x, index, weights)
                    return join_rows(rows, tokens, x.dtype)

                def in_runs(cuts):
                    rows = None
                    for part in torch.tensor_split(table, cuts):
                        lo, hi = int(part[0]), int(part[-1]) + 1
                        # slices: views of the same (UVA) memory. An index (tensors[n][part]) would gather a copy
                        # into GPU memory first, which reads every byte once (this probe's first version: one "chunk"
                        # of all 128 experts at 2,048 tokens 24.6 ms, a copy's time, against 35.7 read in place)
                        w = {n: tensors[n][lo:hi] for n in layout.names}
                        own = torch.full((experts_n,), part.numel(), dtype=torch.long, device=device)
                        own[part] = torch.arange(part.numel(), device=device)
                        r = part_rows(module, layout, w, own, x, index, weights)
                        rows = r if rows is None else rows.add_(r)
                    return join_rows(rows, tokens, x.dtype)

                def two_parts():  # a split layer's prefill: the uva experts' part, then the host's read through UVA
                    return in_runs([experts_n * 78 // 128])

                def host_layout_path():
                    rows = part_rows(module, host_layout, {n: uva_t[n] for n in host_layout.names}, table, x, index,
                                     weights)
                    return join_rows(rows, tokens, x.dtype)

                row[f"{where}_transformers_ms"] = round(timed_ms(theirs, device), 3)
                row[f"{where}_runtime_ms"] = round(timed_ms(ours, device), 3)
                outs[where] = (theirs().float(), ours().float())
                if where == "uva":
                    row["uva_two_parts_ms"] = round(timed_ms(two_parts, device), 3)
                    row["two_parts_max_abs_diff"] = float((outs["uva"][0] - two_parts().float()).abs().max())
                    for c in args.chunks:
                        cuts = [experts_n * i // c for i in range(1, c)]
                        row[f"uva_chunks_{c}_ms"] = round(timed_ms(lambda cuts=cuts: in_runs(cuts), device), 3)
                    row["uva_host_layout_ms"] = round(timed_ms(host_layout_path, device), 3)
                    outs["host_layout"] = host_layout_path().float()
        for n, p in params.items():
            p.data = resident[n]
        a, b = outs["uva"]
        row["max_abs_diff"] = float((a - b).abs().max())
        row["host_layout_max_abs_diff"] = float((a - outs["host_layout"]).abs().max())
        row["scale"] = float(a.abs().max())
        if uva_gbps:
            once = total * touched / experts_n / uva_gbps / 1e6
            row["read_once_ms"] = round(once, 3)
            row["transformers_passes"] = round(row["uva_transformers_ms"] / once, 3)
            row["runtime_passes"] = round(row["uva_runtime_ms"] / once, 3)
            row["host_layout_passes"] = round(row["uva_host_layout_ms"] / once, 3)
            row["two_parts_passes"] = round(row["uva_two_parts_ms"] / once, 3)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
