"""A 2,048-token forward compiled (``torch.compile(mode="reduce-overhead")``) with the routed experts on UVA:
the runtime's tall-tile path traced by dynamo against transformers' experts forward, and the resident model's
compiled forward against itself (is it deterministic at this size?).

    PYTHONPATH=. python bench/probe_compile_tall.py --out $OUT/compile-tall.jsonl
    python bench/probe_compile_tall.py --device cpu --smoke --out /tmp/ct.jsonl

Rows: each compiled or eager forward's median ms and its logits against the resident model's compiled logits
(equal bit for bit, and the largest difference)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from bench_cost import build  # noqa: E402
from bench_generate import run_loop  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
import runtime.experts_forward as experts_forward  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

GB = 10**9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--budget", type=float, default=12.0, help="GB")
    ap.add_argument("--repeat", type=int, default=0, help="only the plan's compiled forward, this many times")
    ap.add_argument("--calls", type=int, default=0, help="only this many calls of one compiled forward, the resident "
                    "model's and then the plan's, each call's logits against the first call's (the first calls run "
                    "and record, the later ones replay the CUDA graph): is one compiled artifact deterministic?")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch._inductor.config.emulate_precision_casts = True
    out = open(args.out, "w")
    model, config = build("moe", args.smoke, device)
    spec = runtime.describe(model, name="moe")
    if args.smoke:
        spec = spec.model_copy(update={"memory": spec.memory.model_copy(update={"workspace": 0, "graphs": 0})})
        total = sum(t.nbytes for layer in spec.model.expanded() for t in layer.params)
        budget = total // 2
    else:
        budget = int(args.budget * GB)
    tokens = 64 if args.smoke else args.tokens
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(1)).to(device)
    ref = {}

    def write(name: str, logits: torch.Tensor, ms: float) -> None:
        base = ref.get("compiled")
        row = {"run": name, "ms": ms}
        if base is not None:
            row["equal"] = bool(torch.equal(logits, base))
            row["max_abs_diff"] = (logits.float() - base.float()).abs().max().item()
        if "eager" in ref and name.endswith("eager"):
            row["equal_eager"] = bool(torch.equal(logits, ref["eager"]))
        if "first run" in ref:  # the plan's compiled runs against its first: deterministic?
            row["equal_first_run"] = bool(torch.equal(logits, ref["first run"]))
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps(row), flush=True)

    def eager() -> tuple[torch.Tensor, float]:
        with torch.no_grad():
            return model(ids, use_cache=False).logits.clone(), 0.0

    ref["eager"] = eager()[0]
    write("resident eager", ref["eager"], 0.0)
    if args.calls:
        return calls(args, model, spec, budget, ids, ref, write, device, out)
    torch._dynamo.reset()
    r = run_loop(model, ids, device)
    ref["compiled"] = r["logits"]
    write("resident compiled", r["logits"], r["ms"])
    if not args.repeat:
        torch._dynamo.reset()
        r = run_loop(model, ids, device)
        write("resident compiled again", r["logits"], r["ms"])
    plan = planner.plan(spec, gpu_budget=budget, workload=Workload({"decode": WorkloadItem(tokens=1, mode="graph")}))
    own = experts_forward.tall_tiles_apply
    with runtime.apply(plan, model, device=device):
        write("offloaded eager", *eager())
        for i in range(args.repeat):
            torch._dynamo.reset()
            r = run_loop(model, ids, device)
            if i == 0:
                ref["first run"] = r["logits"]
            write(f"offloaded compiled, run {i + 1}", r["logits"], r["ms"])
        if args.repeat:
            torch._dynamo.reset()
            out.close()
            return 0
        torch._dynamo.reset()
        r = run_loop(model, ids, device)
        write("offloaded compiled, tall tiles", r["logits"], r["ms"])
        experts_forward.tall_tiles_apply = lambda *a: False if torch.compiler.is_compiling() else own(*a)
        try:
            torch._dynamo.reset()
            r = run_loop(model, ids, device)
            write("offloaded compiled, module forward", r["logits"], r["ms"])
        finally:
            experts_forward.tall_tiles_apply = own
        torch._dynamo.reset()
    out.close()
    return 0


def calls(args, model, spec, budget, ids, ref, write, device, out) -> int:
    """``--calls``: one compiled forward called again and again, resident and under the plan."""
    plan = planner.plan(spec, gpu_budget=budget, workload=Workload({"decode": WorkloadItem(tokens=1, mode="graph")}))

    def called(label: str) -> None:
        torch._dynamo.reset()
        compiled = torch.compile(model, mode="reduce-overhead")
        ref.pop("first run", None)
        with torch.no_grad():
            for i in range(args.calls):
                logits = compiled(ids, use_cache=False).logits.clone()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i == 0:
                    ref.setdefault("compiled", logits)
                    ref["first run"] = logits
                write(f"{label} compiled, call {i + 1}", logits, 0.0)

    called("resident")
    with runtime.apply(plan, model, device=device):
        called("offloaded")
    torch._dynamo.reset()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
