"""Each MoE layer's experts timed on the GPU's stream, per plan and workload (issue 21: hybrid prefills ran
1.42-1.73x faster than predicted on 2026-12-02, 1.31-1.47x with the measured routing, while plans that read the
same experts through UVA in transformers' module were within 2%).

    PYTHONPATH=. python bench/probe_split_layers.py --out $OUT/split-layers.jsonl     # the H200
    python bench/probe_split_layers.py --device cpu --dry-run --out /tmp/split.jsonl   # tiny, any machine

bench_predict_h200.py's Qwen3-MoE model and cases; each case's plan made with ``--profile`` (default the bundled
h200) and applied; per workload one untimed forward, then ``--repeat`` forwards with a CUDA event recorded before
and after every layer's experts module (forward hooks), so a layer's row is the stream's time from its experts'
start to their end: the host's part and the stream's wait for it included, the layers around them not. The routing
the model takes at each workload (``runtime.record_routing``) and the plans are written too, so the per-layer
predictions can be made on the CPU afterwards (``--predict`` on the rows file)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = ("auto 0.5", "experts on uva, 0.5", "auto 0.3")


def experts_modules(model) -> dict[str, object]:
    """Each decoder layer's routed-experts module, by the layer's name."""
    from runtime.expert_math import is_experts_module

    blocks = [(name, m) for name, m in model.named_modules() if is_experts_module(m)]
    return {name.rpartition(".mlp")[0]: m for name, m in blocks}


def timed_layers(model, ids, device, repeat: int) -> dict[str, float]:
    """Median ms per layer of its experts module on the stream (CUDA events; wall clock on the CPU)."""
    import time

    import torch

    mods = experts_modules(model)
    marks: dict[str, list] = {name: [] for name in mods}
    cuda = device.type == "cuda"

    def mark(name):
        def hook(*_):
            if cuda:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                marks[name].append(e)
            else:
                marks[name].append(time.perf_counter())
        return hook

    handles = []
    for name, m in mods.items():
        handles.append(m.register_forward_pre_hook(mark(name)))
        handles.append(m.register_forward_hook(mark(name)))
    try:
        with torch.inference_mode():
            for _ in range(repeat):
                model(ids, use_cache=False)
        if cuda:
            torch.cuda.synchronize(device)
    finally:
        for h in handles:
            h.remove()
    out = {}
    for name, ev in marks.items():
        pairs = zip(ev[0::2], ev[1::2])
        ms = [a.elapsed_time(b) if cuda else (b - a) * 1e3 for a, b in pairs]
        out[name] = round(statistics.median(ms), 3)
    return out


def measure(args) -> None:
    import torch

    import bench_predict_h200 as bench
    import runtime
    from schemas import dump_model
    from schemas.hardware import load_hardware

    device = torch.device(args.device)
    hw = load_hardware(args.profile or "h200")
    workload = bench.DRY_WORKLOADS if args.dry_run else bench.WORKLOADS
    model, config = build = bench.build_model("moe", args.dry_run, device)
    del build
    spec = runtime.describe(model, name="moe")
    total = sum(layer.nbytes for layer in spec.model.expanded())
    out = open(args.out, "w")

    def row(**kw):
        out.write(json.dumps(kw) + "\n")
        out.flush()

    bench.warm_up(model, config, workload, device, 0 if args.dry_run else 2)
    routing = bench.measured_routing(model, config, workload, device)
    row(type="routing", shares={w: {layer: [round(x, 7) for x in q] for layer, q in s.items()}
                                 for w, s in routing.items()})
    names = [w for w in args.workloads if w in dict(workload.items())]
    for name in names:
        ids = bench.inputs(name, dict(workload.items())[name].tokens, config.vocab_size, device)
        timed_layers(model, ids, device, 1)
        row(type="layers", plan="no offload", workload=name, ms=timed_layers(model, ids, device, args.repeat))
    for label in args.cases:
        case = next(c for c in bench.PLANS if c.model == "moe" and c.label == label)
        plan, note = bench.make_plan(case, spec, total, hw, workload)
        row(type="plan", plan=label, note=note, yaml=dump_model(plan))
        with runtime.apply(plan, model, device=str(device)):
            for name in names:
                ids = bench.inputs(name, dict(workload.items())[name].tokens, config.vocab_size, device)
                timed_layers(model, ids, device, 1)
                ms = timed_layers(model, ids, device, args.repeat)
                row(type="layers", plan=label, workload=name, ms=ms)
                print(label, name, round(sum(ms.values()), 2), json.dumps(ms), flush=True)


def predicted(rows: list[dict]) -> None:
    """The rows' layers beside the cost model's experts time for each (the profile of ``--profile``)."""
    from planner.cost.expert_reads import touched_by
    from planner.cost.host_experts import ExpertShape, chances, gpu_parts_ms, host_part_ms
    from schemas.plan_experts import host_computes
    from planner.cost.layer import param_time
    import bench_predict_h200 as bench
    from schemas.hardware import load_hardware
    from schemas.io import load_model
    from schemas.plan import Plan

    routing = next(r for r in rows if r["type"] == "routing")["shares"]
    plans = {r["plan"]: load_model(Plan, r["plan"], r["yaml"]) for r in rows if r["type"] == "plan"}
    workload = bench.DRY_WORKLOADS if ARGS.dry_run else bench.WORKLOADS
    tokens = {name: item.tokens for name, item in workload.items()}
    hw = load_hardware(ARGS.profile or "h200")
    base = {r["workload"]: r["ms"] for r in rows if r["type"] == "layers" and r["plan"] == "no offload"}
    for r in rows:
        if r["type"] != "layers" or r["plan"] not in plans:
            continue
        t = tokens[r["workload"]]
        shares = routing.get(r["workload"], {}) if r["workload"] == "prefill" else {}  # as the bench samples them
        for layer in plans[r["plan"]].layers:
            if layer.name not in r["ms"] or not layer.offloaded:
                continue
            s = shares.get(layer.name)
            if layer.experts is not None:
                shape = ExpertShape.of(layer)
                q = chances(layer.experts, shape, s)
                split = layer.experts
                on_host = host_computes(split, t)
                gpu = gpu_parts_ms(q, on_host, t, shape, hw)  # as planner/cost/host_experts.py's split_work
                host = host_part_ms(q["cpu"], t, shape, hw, bool(q["uva"])) if on_host else 0.0
                pred = max(gpu, host)
                what = f"split gpu {len(split.gpu)} uva {len(split.uva)} cpu {len(split.cpu)}" + \
                    (" (cpu via uva)" if q["cpu"] and not on_host else "")
                touched = touched_by(q["uva"] + q["cpu"] + q["gpu"], t)[0]
            else:
                rels = [rel for rel in layer.offloaded if "experts" in rel]
                if not rels:
                    continue
                pred = sum(param_time(layer.name, rel, layer.params[rel], t, hw, (layer.moe.experts, layer.moe.top_k),
                                      s).uva_ms for rel in rels)
                what = "uva " + ",".join(rel.rpartition(".")[2] for rel in rels)
                touched = float("nan")
            meas = r["ms"][layer.name]
            rest = base.get(r["workload"], {}).get(layer.name, 0.0)
            print(f"{r['plan'][:22]:22} {r['workload']:8} {layer.name:16} {what:38} touched {touched:6.1f} "
                  f"measured {meas:7.2f} (resident {rest:5.2f}) predicted {pred:7.2f}  x{pred / max(meas, 1e-9):.2f}")


def main(argv=None) -> int:
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="rows file (jsonl); with --predict: the rows file to read")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--profile", help="hardware profile (name or file) the plans are made and predicted with")
    p.add_argument("--cases", nargs="*", default=list(CASES))
    p.add_argument("--workloads", nargs="*", default=["prefill", "decode32"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--predict", action="store_true", help="read --out and print each layer's prediction beside it")
    ARGS = p.parse_args(argv)
    if ARGS.predict:
        predicted([json.loads(line) for line in Path(ARGS.out).read_text().splitlines() if line.strip()])
    else:
        measure(ARGS)
    return 0


ARGS: argparse.Namespace


if __name__ == "__main__":
    sys.exit(main())
