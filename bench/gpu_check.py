"""Checks and times the runtime on a CUDA GPU, in one run (the device machine's lease is short).

    PYTHONPATH=.:tests python bench/gpu_check.py --out $OUT [--sections all|prims,correct,memory,leak,speed]

Each section prints one line per check: PASS/FAIL/INFO with figures; everything also
goes to OUT/gpu_check.jsonl. A failing check does not stop the other sections.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import planner  # noqa: E402
import runtime  # noqa: E402
from hand_plans import span_plan  # noqa: E402
from models import LlamaConfig, make_llama  # noqa: E402

RESULTS: list[dict] = []
OUT = Path(".")


def record(section: str, name: str, ok: bool | None, **figures) -> None:
    status = "INFO" if ok is None else ("PASS" if ok else "FAIL")
    RESULTS.append({"section": section, "check": name, "status": status, **figures})
    figs = " ".join(f"{k}={v}" for k, v in figures.items())
    print(f"[{status}] {section}/{name} {figs}", flush=True)
    with open(OUT / "gpu_check.jsonl", "a") as f:
        f.write(json.dumps(RESULTS[-1], default=str) + "\n")


def section(fn):
    def run(*a, **k):
        try:
            fn(*a, **k)
        except Exception as exc:  # noqa: BLE001
            record(fn.__name__, "crashed", False, error=repr(exc)[:300])
            traceback.print_exc()
        finally:
            gc.collect()
            torch.cuda.empty_cache()
    run.__name__ = fn.__name__
    return run


def proc_status() -> dict:
    """Host memory of this process from /proc/self/status, in bytes (VmRSS, VmPin, VmLck)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmPin", "VmLck"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def cuda_time(fn, iters: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of fn() measured with CUDA events (runtime.calibrate's timer)."""
    from runtime.calibrate import gpu_ms

    return gpu_ms(fn, repeat=iters, warmup=warmup)


def h2d_gbps(nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    src.random_(0, 255)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    ms = cuda_time(lambda: dst.copy_(src, non_blocking=True), iters=20)
    return nbytes / ms / 1e6


def budget_plan(spec, frac: float, **kw):
    """A budget plan at frac of the model's bytes, or at the smallest feasible budget above it."""
    from planner.errors import InfeasibleError

    total = sum(layer.nbytes for layer in spec.model.expanded())
    try:
        return planner.plan(spec, gpu_budget=int(total * frac), **kw)
    except InfeasibleError as exc:
        return planner.plan(spec, gpu_budget=exc.min_gpu_budget, **kw)


def spec_budget(model, frac: float, **kw):
    spec = runtime.describe(model, name="llama-test")
    return spec, budget_plan(spec, frac, **kw)


# ---------------------------------------------------------------------------------------
@section
def prims():
    from runtime.pinned import pack
    from runtime.uva import device_view

    record("prims", "env", None, torch=torch.__version__, gpu=torch.cuda.get_device_name(),
           cudart_get_last_error=hasattr(torch.cuda.cudart(), "cudaGetLastError"))
    src = torch.randn(4096, 1000, dtype=torch.bfloat16)
    arena, (view,) = pack([src], pin=True)
    record("prims", "host_register_pins", arena.registered and view.is_pinned(), registered=arena.registered)
    dv = device_view(view, torch.device("cuda"))
    record("prims", "uva_view_reads_host", torch.equal(dv.cpu(), src) and dv.is_cuda)
    nc = torch.randn(300, 200).t()  # non-contiguous
    arena2, (v2,) = pack([nc], pin=True)
    record("prims", "pack_keeps_strides", v2.stride() == nc.stride() and torch.equal(v2, nc))
    big = torch.empty(1 << 30, dtype=torch.uint8)
    big.random_(0, 255)
    arena3, (v3,) = pack([big], pin=True)
    dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    ms = cuda_time(lambda: dst.copy_(v3, non_blocking=True), iters=20)
    ref = h2d_gbps()
    record("prims", "h2d_registered_vs_pin_memory", None, registered_gbps=round((1 << 30) / ms / 1e6, 1),
           pin_memory_gbps=round(ref, 1))
    for a in (arena, arena2, arena3):
        a.close()


def run_modes(model, ids, modes):
    """Outputs of model on ids in each mode: eager, compile, graph."""
    out = {}
    with torch.no_grad():
        if "eager" in modes:
            out["eager"] = [model(ids).clone() for _ in range(3)]
        if "graph" in modes:
            static = ids.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    model(static)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = model(static)
            res = []
            for k in range(3):
                static.copy_((ids + k) % 500)
                g.replay()
                res.append(y.clone())
            out["graph"] = res
            del g
        if "compile" in modes:
            torch._dynamo.reset()
            cm = torch.compile(model, fullgraph=True)
            out["compile"] = [cm(ids).clone() for _ in range(3)]
            torch._dynamo.reset()
    return out


@section
def correct(modes=("eager", "graph", "compile")):
    torch._inductor.config.emulate_precision_casts = True
    cfg = LlamaConfig(vocab=512, dim=256, layers=18, heads=4, kv_heads=2, hidden=704)
    base = make_llama(cfg)
    ids = torch.randint(0, 500, (1, 8), device="cuda")
    ref_model = copy.deepcopy(base).cuda()
    ref = run_modes(ref_model, ids, modes)
    del ref_model
    spec = runtime.describe(base, name="llama-18")
    plans = {
        "prefetch_budget": budget_plan(spec, 0.55, backend="prefetch"),
        "prefetch_g4k3_s2": planner.plan(spec, strategy="group", group_size=4, num_in_group=3, prefetch_step=2,
                                         backend="prefetch"),
        "prefetch_g4k3_s3": planner.plan(spec, strategy="group", group_size=4, num_in_group=3, prefetch_step=3,
                                         backend="prefetch"),
        "prefetch_all_s4": planner.plan(spec, strategy="group", group_size=1, num_in_group=1, prefetch_step=4,
                                        backend="prefetch"),
        "prefetch_all_s1": planner.plan(spec, strategy="group", group_size=1, num_in_group=1, prefetch_step=1,
                                        backend="prefetch"),
        "auto_30": budget_plan(spec, 0.30),
        "span_head_s2": span_plan(spec, range(18), 2, ("lm_head",)),
        "span_head_s1_gaps": span_plan(spec, [1, 2, 5, 6, 9, 13, 17], 1, ("lm_head",)),
        "span_embed_head_s3": span_plan(spec, range(0, 18, 2), 3, ("model.embed_tokens", "lm_head")),
        "uva_budget": budget_plan(spec, 0.55, backend="uva"),
    }
    for pname, plan in plans.items():
        s = plan.summary
        for origin in ("cpu", "cuda"):
            model = copy.deepcopy(base).to(origin)
            before = {k: v.clone().cpu() for k, v in model.state_dict().items()}
            h = runtime.apply(plan, model, "cuda")
            try:
                out = run_modes(model, ids, modes if origin == "cpu" else ("eager",))
            except Exception:
                h.remove()
                raise
            for mode, outs in out.items():
                same = all(torch.equal(a, b) for a, b in zip(outs, ref[mode]))
                maxdiff = max((a.float() - b.float()).abs().max().item() for a, b in zip(outs, ref[mode]))
                record("correct", f"{pname}/{origin}/{mode}", same, offloaded_layers=s.offloaded_layers,
                       step=s.prefetch_step, max_abs_diff=maxdiff)
            h.remove()
            after = model.state_dict()
            restored = all(torch.equal(before[k], after[k].cpu()) and after[k].device.type == origin
                           for k in before)
            record("correct", f"{pname}/{origin}/remove_bit_identical", restored)
            del model, h
    torch._inductor.config.emulate_precision_casts = False
    # compile without precision emulation: report only
    if "compile" in modes:
        ref_model = copy.deepcopy(base).cuda()
        r = run_modes(ref_model, ids, ("compile",))["compile"]
        model = copy.deepcopy(base)
        h = runtime.apply(plans["prefetch_budget"], model, "cuda")
        o = run_modes(model, ids, ("compile",))["compile"]
        record("correct", "prefetch_budget/compile_default_precision", None,
               bit_identical=all(torch.equal(a, b) for a, b in zip(o, r)),
               max_abs_diff=max((a.float() - b.float()).abs().max().item() for a, b in zip(o, r)))
        h.remove()


@section
def memory():
    cfg = LlamaConfig(vocab=8192, dim=2048, layers=16, heads=16, kv_heads=4, hidden=5632)
    base = make_llama(cfg)
    spec = runtime.describe(base, name="llama-mem")
    plan = budget_plan(spec, 0.5, backend="prefetch")
    s = plan.summary
    ids = torch.randint(0, 8000, (1, 16), device="cuda")
    # activations: the unoffloaded model's forward peak minus its weights
    ref = copy.deepcopy(base).cuda()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    w = torch.cuda.memory_allocated()
    with torch.no_grad():
        want = ref(ids)
    act = torch.cuda.max_memory_allocated() - w
    del ref
    gc.collect()
    torch.cuda.empty_cache()
    base_alloc = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    h = runtime.apply(plan, base, "cuda")
    apply_peak = torch.cuda.max_memory_allocated() - base_alloc
    record("memory", "apply_peak_le_plan_peak", apply_peak <= s.peak_gpu_bytes * 1.02,
           apply_peak=apply_peak, plan_peak=s.peak_gpu_bytes)
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        got = base(ids)
    fwd_peak = torch.cuda.max_memory_allocated() - base_alloc
    record("memory", "forward_peak_minus_activations_le_plan_peak_2pct",
           fwd_peak - act <= s.peak_gpu_bytes * 1.02, forward_peak=fwd_peak, activations=act,
           plan_peak=s.peak_gpu_bytes, ratio=round((fwd_peak - act) / s.peak_gpu_bytes, 4))
    record("memory", "output_equal", torch.equal(got, want))
    h.remove()
    # host memory added when the model starts on the GPU
    model = copy.deepcopy(base).cuda()
    gc.collect()
    p0 = proc_status()
    h = runtime.apply(plan, model, "cuda")
    p1 = proc_status()
    added = p1["VmRSS"] - p0["VmRSS"]
    pinned = p1.get("VmPin", 0) - p0.get("VmPin", 0)
    arenas = h._placement.host_bytes
    record("memory", "host_added_le_1.05x_pinned", max(added, arenas) <= 1.05 * s.pinned_host_bytes,
           rss_added=added, vmpin_added=pinned, arena_bytes=arenas, pinned_host_bytes=s.pinned_host_bytes,
           ratio_rss=round(added / max(s.pinned_host_bytes, 1), 4),
           ratio_arenas=round(arenas / max(s.pinned_host_bytes, 1), 4))
    h.remove()
    p2 = proc_status()
    record("memory", "remove_releases_pinned", None, vmpin_after_remove=p2.get("VmPin", 0) - p0.get("VmPin", 0),
           rss_after_remove=p2["VmRSS"] - p0["VmRSS"])
    # the same with PyTorch's caching host allocator, for comparison (what pin_memory() costs)
    gc.collect()
    q0 = proc_status()
    held = [model.get_parameter(f"{layer.name}.{r}").detach().cpu().pin_memory()
            for layer in plan.layers for r in layer.offloaded]
    q1 = proc_status()
    record("memory", "pin_memory_for_comparison", None, rss_added=q1["VmRSS"] - q0["VmRSS"],
           ratio_rss=round((q1["VmRSS"] - q0["VmRSS"]) / max(s.pinned_host_bytes, 1), 4))
    del held


@section
def leak():
    cfg = LlamaConfig(vocab=512, dim=256, layers=16, heads=4, kv_heads=2, hidden=704)
    model = make_llama(cfg)
    spec, plan = spec_budget(model, 0.5, backend="prefetch")
    _, uplan = spec_budget(model, 0.5, backend="uva")
    ids = torch.randint(0, 500, (1, 4), device="cuda")

    def cycle(p):
        h = runtime.apply(p, model, "cuda")
        with torch.no_grad():
            model(ids)
        h.remove()

    for _ in range(3):
        cycle(plan), cycle(uplan)
    gc.collect()
    m0, r0 = torch.cuda.memory_allocated(), proc_status()["VmRSS"]
    pin0 = proc_status().get("VmPin", 0)
    for i in range(100):
        cycle(plan if i % 2 else uplan)
    gc.collect()
    m1, r1 = torch.cuda.memory_allocated(), proc_status()["VmRSS"]
    pin1 = proc_status().get("VmPin", 0)
    record("leak", "100_cycles_pinned_unchanged", pin1 == pin0, vmpin_before=pin0, vmpin_after=pin1)
    from runtime import prefetch_ops as ops

    record("leak", "100_cycles_gpu_alloc_unchanged", m1 == m0, before=m0, after=m1)
    record("leak", "100_cycles_rss_growth_small", (r1 - r0) < 64 << 20, rss_growth=r1 - r0)
    record("leak", "no_registered_offloaders_left", len(ops._OFFLOADERS) == 0)


@section
def speed():
    cfg = LlamaConfig(vocab=32000, dim=4096, layers=32, heads=32, kv_heads=8, hidden=14336)
    with torch.device("cuda"):
        torch.manual_seed(0)
        from models import Llama

        model = Llama(cfg).to(torch.bfloat16).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    spec = runtime.describe(model, name="llama-8b-like")
    total = sum(layer.nbytes for layer in spec.model.expanded())
    ids = torch.randint(0, 32000, (1, 1), device="cuda")
    with torch.no_grad():
        full_ms = cuda_time(lambda: model(ids))
    bw = h2d_gbps()
    record("speed", "full_gpu_decode", None, ms=round(full_ms, 3), model_gb=round(total / 1e9, 2),
           h2d_gbps=round(bw, 1))
    for frac in (0.6, 0.3):
        plan = budget_plan(spec, frac, backend="prefetch")
        s = plan.summary
        h = runtime.apply(plan, model, "cuda")
        with torch.no_grad():
            ms = cuda_time(lambda: model(ids))
        bound = max(full_ms, s.offloaded_bytes / bw / 1e6)
        record("speed", f"prefetch_decode_budget{frac}", ms <= 1.10 * bound, ms=round(ms, 3),
               bound_ms=round(bound, 3), ratio=round(ms / bound, 4), offloaded_gb=round(s.offloaded_bytes / 1e9, 2),
               step=s.prefetch_step, layers=s.offloaded_layers)
        h.remove()
        hs = runtime.apply(plan, model, "cuda", stats=True)
        with torch.no_grad():
            for _ in range(5):
                model(ids)
        st = hs.stats()["forwards"][-1]
        record("speed", f"prefetch_copy_stream_bw_budget{frac}", (st["copy_gbps"] or 0) >= 0.9 * bw,
               copy_gbps=st["copy_gbps"], plain_gbps=round(bw, 1), stall_ms=st["stall_ms"],
               bytes=st["bytes_copied"])
        hs.remove()
        # same plan through UVA, and a prefill, for the docs
        uplan = budget_plan(spec, frac, backend="uva")
        hu = runtime.apply(uplan, model, "cuda")
        with torch.no_grad():
            ums = cuda_time(lambda: model(ids))
        record("speed", f"uva_decode_budget{frac}", None, ms=round(ums, 3),
               offloaded_gb=round(uplan.summary.offloaded_bytes / 1e9, 2))
        hu.remove()
    # prefill (512 tokens): prefetch copies each weight once, UVA reads it once per tile pass
    pids = torch.randint(0, 32000, (1, 512), device="cuda")
    with torch.no_grad():
        full_p = cuda_time(lambda: model(pids), iters=5)
        plan = budget_plan(spec, 0.6, backend="prefetch")
        h = runtime.apply(plan, model, "cuda")
        pre_p = cuda_time(lambda: model(pids), iters=5)
        h.remove()
        uplan = budget_plan(spec, 0.6, backend="uva")
        h = runtime.apply(uplan, model, "cuda")
        uva_p = cuda_time(lambda: model(pids), iters=5)
        h.remove()
    record("speed", "prefill512", None, full_gpu_ms=round(full_p, 2), prefetch_ms=round(pre_p, 2),
           uva_ms=round(uva_p, 2), prefetch_offloaded_gb=round(plan.summary.offloaded_bytes / 1e9, 2),
           uva_offloaded_gb=round(uplan.summary.offloaded_bytes / 1e9, 2))
    # graph replay decode
    plan = budget_plan(spec, 0.6, backend="prefetch")
    h = runtime.apply(plan, model, "cuda")
    static = ids.clone()
    with torch.no_grad():
        s_ = torch.cuda.Stream()
        s_.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s_):
            model(static)
        torch.cuda.current_stream().wait_stream(s_)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model(static)
    gms = cuda_time(g.replay)
    bound = max(full_ms, plan.summary.offloaded_bytes / bw / 1e6)
    record("speed", "prefetch_decode_graph_budget0.6", gms <= 1.10 * bound, ms=round(gms, 3),
           bound_ms=round(bound, 3), ratio=round(gms / bound, 4))
    del g
    h.remove()


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sections", default="prims,correct,memory,leak,speed")
    args = ap.parse_args()
    OUT = Path(args.out)
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for name in args.sections.split(","):
        t = time.time()
        globals()[name]()
        print(f"--- {name}: {time.time() - t:.1f} s", flush=True)
    fails = [r for r in RESULTS if r["status"] == "FAIL"]
    print(f"\n{len(RESULTS)} checks, {len(fails)} failed, {time.time() - t0:.0f} s")
    for r in RESULTS:
        print(f"{r['status']:4} {r['section']}/{r['check']}")


if __name__ == "__main__":
    main()
