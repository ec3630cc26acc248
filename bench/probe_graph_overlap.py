"""Why vLLM's group 8/2 step 2 plan replays a 2,048-token prefill of the Llama-3-8B shape as a CUDA graph in
126 ms where it runs eagerly in 78 (the only such plan of 27 in bench_predict_h200.py, 2026-12-02 -02m and -02o;
the others replay in 0.98-1.06x their eager time): do its copies stop overlapping the compute under capture?

    PYTHONPATH=. python bench/probe_graph_overlap.py > $OUT/graph-overlap.jsonl     # the H200

For that plan and three others that prefetch (controls), eager and replayed: the step, the copies the runtime
made late (synchronously, on the compute stream) while the graph was captured, and one forward under
torch.profiler: the host-to-GPU copies' intervals merged, the kernels' busy time, how much of the copies ran
beside kernels, and the compute stream's idle gaps longer than 0.3 ms (where the GPU waited)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import runtime  # noqa: E402
from bench_predict_h200 import PLANS, WORKLOADS, build_model, inputs, make_plan, step_ms  # noqa: E402
from compare_run import graph as graph_step  # noqa: E402

LABELS = ("vllm group 8/2 step 2", "vllm group 7/1 step 3 (2 of 4 alone in a slot)",
          "group 8/1 prefetch step 2 (4 layers)", "group 4/1 prefetch step 2 (8 layers)")
TOKENS = 2048


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


def traced(fn) -> dict:
    """One call of ``fn`` under the profiler: its copies and kernels on the GPU's clock, ms from the first."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not events:
        return {"events": 0}
    t0 = min(e.time_range.start for e in events)
    copies = merged([((e.time_range.start - t0) / 1e3, (e.time_range.end - t0) / 1e3) for e in events
                     if "memcpy" in e.name.lower() and "htod" in e.name.lower().replace(" ", "")])
    kernels = merged([((e.time_range.start - t0) / 1e3, (e.time_range.end - t0) / 1e3) for e in events
                      if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()])
    end = max(e.time_range.end for e in events)
    gaps = [(round(b[0] - a[1], 3), round(a[1], 3)) for a, b in zip(kernels, kernels[1:]) if b[0] - a[1] > 0.3]
    return {"events": len(events), "span_ms": round((end - t0) / 1e3, 3),
            "copy_ms": round(sum(b - a for a, b in copies), 3),
            "kernel_busy_ms": round(sum(b - a for a, b in kernels), 3),
            "copy_beside_kernels_ms": round(overlap(copies, kernels), 3),
            "copies": [[round(a, 2), round(b, 2)] for a, b in copies][:40],
            "kernel_gaps": gaps[:40]}


def sequence(model, config, spec, total, hw, device) -> None:
    """bench_predict_h200.py's order on one applied plan (each workload eager, its copy timeline at 32 tokens or
    fewer, then captured and replayed): the step and the copies made late in each capture, to find what makes the
    prefill's replay slower there and not alone."""
    from bench_predict_h200 import blocks_of, copy_timeline

    for case in [c for c in PLANS if c.model == "llama" and c.label in LABELS[:1] + LABELS[2:3]]:
        plan, _ = make_plan(case, spec, total, hw, WORKLOADS)
        with runtime.apply(plan, model, device="cuda") as handle:
            off = handle.offloader
            for name, item in WORKLOADS.items():
                ids = inputs(name, item.tokens, config.vocab_size, device)
                eager = lambda: model(ids, use_cache=False)  # noqa: E731
                eager_ms = step_ms(eager, device)
                if item.tokens <= 32:
                    copy_timeline(handle, eager, blocks_of(model), device)
                late_before = off.current.late_copies
                with torch.inference_mode():
                    run = graph_step(model, ids)
                late = off.current.late_copies - late_before
                graph_ms = step_ms(run, device)
                print(json.dumps({"sequence": case.label, "workload": name, "eager_ms": round(eager_ms, 3),
                                  "graph_ms": round(graph_ms, 3), "late_copies_in_capture": late,
                                  "issued": sorted(off.issued), "captured": sorted(off.captured)}), flush=True)
                del run
        torch.cuda.empty_cache()


def main() -> int:
    device = torch.device("cuda")
    model, config = build_model("llama", False, device)
    spec = runtime.describe(model, name="llama")
    total = sum(layer.nbytes for layer in spec.model.expanded())
    from schemas.hardware import load_hardware

    hw = load_hardware("h200")
    if "--sequence" in sys.argv[1:]:
        sequence(model, config, spec, total, hw, device)
        return 0
    ids = inputs("prefill", TOKENS, config.vocab_size, device)
    cases = [c for c in PLANS if c.model == "llama" and c.label in LABELS]
    for case in cases:
        plan, _ = make_plan(case, spec, total, hw, WORKLOADS)
        layers = [[layer.name, layer.prefetch.slot, layer.prefetch.copy_before, layer.prefetch.previous_forward]
                  for layer in plan.layers if layer.prefetch is not None]
        with runtime.apply(plan, model, device="cuda") as handle:
            off = handle.offloader
            eager = lambda: model(ids, use_cache=False)  # noqa: E731
            with torch.inference_mode():
                eager_ms = step_ms(eager, device)
                late_before = off.current.late_copies
                run = graph_step(model, ids)
                late_in_capture = off.current.late_copies - late_before
                graph_ms = step_ms(run, device)
                eager_trace, graph_trace = traced(eager), traced(run)
            print(json.dumps({"plan": case.label, "layers": layers, "eager_ms": round(eager_ms, 3),
                              "graph_ms": round(graph_ms, 3), "late_copies_in_capture": late_in_capture,
                              "eager": eager_trace, "graph": graph_trace}), flush=True)
            del run
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
