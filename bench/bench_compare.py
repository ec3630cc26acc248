"""This project against other offloaders at the same GPU memory, in one process run (issue 10).

    PYTHONPATH=. python bench/bench_compare.py --out $OUT/compare.jsonl --profile-diffusers 2>&1 | tee $OUT/compare.log
    python bench/compare_report.py $OUT/compare.jsonl --md $OUT/compare.md --png docs/compare-h200.png
    python bench/bench_compare.py --device cpu --smoke --out /tmp/compare.jsonl   # CPU smoke run

The H200 run takes about 8 minutes (--time-budget: 450 s of measuring; what would start later is skipped).

Models (transformers, random bf16 weights built on the device): the Llama-3-8B shape (16.06 GB) at an 8 GB
budget and a Qwen3-MoE shape (128 experts, top-8, 31.2 GB) at 12 GB. Workloads: decode of 1 and of 32
sequences (one token each) and a prefill of 2,048 tokens, ``use_cache=False``. Contenders, each on a fresh
copy of the same model and inputs: no offload (the floor); this project's ``auto`` plan and its
predicted-fastest hand plans for prefetch and for UVA (these and the floor eager and in CUDA graph replay;
torch.compile of ``auto`` on Llama decode at the end if time is left); a naive offloader
(compare_naive.py) offloading the layers the budget plan offloads; Accelerate's
``infer_auto_device_map`` + ``dispatch_model`` at the budget and ``cpu_offload``; diffusers'
``apply_group_offloading`` swept over block/leaf level x use_stream x record_stream x low_cpu_mem_usage
on Llama decode b=1, its fastest configuration then run everywhere; and this project's ``auto`` at the
GPU memory that configuration used (matched in up to two attempts: compare_match.py). The link bound of a
row is max(floor, (model bytes - budget) / pinned host-to-GPU bandwidth measured in this run); a row of
ours also has its own plan's bound, max(floor, offloaded bytes / bandwidth), and the plan's predicted step.

Each measurement is one JSON line in --out, written as it is made (a run cut short keeps what it has);
a contender that fails becomes an error row and the run goes on. --time-budget bounds the run: slow
contenders get fewer timed steps (compare_measure.py), and what would start after the budget is spent is
recorded as skipped (the later, least important items: cpu_offload, then torch.compile).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import gc
import os
import platform
import subprocess
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from bench_cost import build, inputs  # noqa: E402
from compare_diffusers import CONFIGS, needs_cuda  # noqa: E402
from compare_measure import empty_host_cache, h2d_gbps, host_snapshot  # noqa: E402
from compare_run import Applied, Case, Run, Skip, run_contender, skip_row  # noqa: E402

import runtime  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

GB = 10**9
WORKLOADS = Workload({"decode": WorkloadItem(tokens=1), "decode32": WorkloadItem(tokens=32),
                      "prefill": WorkloadItem(tokens=2048)})
SMOKE_WORKLOADS = Workload({"decode": WorkloadItem(tokens=1), "decode32": WorkloadItem(tokens=4),
                            "prefill": WorkloadItem(tokens=16)})
BUDGETS = {"llama": 8 * GB, "moe": 12 * GB}
SMOKE_BUDGET_SHARE = {"llama": 0.6, "moe": 0.8}  # of the tiny models' bytes
SKIPPABLE = ("ours", "hand", "naive", "dispatch", "cpu_offload", "diffusers", "graph", "compile", "at-diffusers")
DEFAULT_PROFILED = "block-top-stream,block-stream-record,leaf-stream-record"


def _names(text: str, known, what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in known:
            close = difflib.get_close_matches(n, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise argparse.ArgumentTypeError(f"unknown {what} {n!r}{hint} (known: {', '.join(known)})")
    return names


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSONL file, one line per measurement")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny models, for a CPU run of every code path")
    ap.add_argument("--only", choices=["llama", "moe"])
    ap.add_argument("--skip", type=lambda t: _names(t, SKIPPABLE, "contender"), default=[],
                    help=f"comma-separated, of: {', '.join(SKIPPABLE)}")
    ap.add_argument("--diffusers-configs", type=lambda t: _names(t, CONFIGS, "diffusers configuration"),
                    default=list(CONFIGS), help=f"comma-separated, of: {', '.join(CONFIGS)} (default all)")
    ap.add_argument("--profile-diffusers", nargs="?", const=DEFAULT_PROFILED, default="",
                    type=lambda t: _names(t, CONFIGS, "diffusers configuration"),
                    help="profile one decode step of these diffusers configurations (torch.profiler top-ops "
                         f"tables beside --out); without a value: {DEFAULT_PROFILED}")
    ap.add_argument("--time-budget", type=float, default=450.0, help="seconds of measuring before the rest is skipped")
    ap.add_argument("--slow-step", type=float, default=8.0, help="steps slower than this (s) are timed once")
    ap.add_argument("--step-cap", type=float, default=10.0, help="seconds of timed steps per row at most")
    ap.add_argument("--graph-max-tokens", type=int, default=64,
                    help="CUDA graph replay for workloads of at most this many tokens (default: decode only)")
    try:
        args = ap.parse_args(argv)
    except argparse.ArgumentTypeError as err:  # raised by a type= above for a --flag=value form
        ap.error(str(err))
    if isinstance(args.profile_diffusers, str):
        args.profile_diffusers = _names(args.profile_diffusers, CONFIGS, "diffusers configuration")
    return args


def environment(device: torch.device, args) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"type": "env", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv, "commit": commit, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": ver("transformers"), "accelerate": ver("accelerate"), "diffusers": ver("diffusers"),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "cpus": os.cpu_count(), "host_mem_total": _mem_total(), "smoke": args.smoke,
            "time_budget_s": args.time_budget,
            "pinned_cache_released_between_contenders": empty_host_cache() if device.type == "cuda" else None}


def _mem_total() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration):
        return None


def make_case(key: str, args, device: torch.device, workloads: Workload) -> Case:
    master, config = build(key, args.smoke, device)
    spec = runtime.describe(master, name=key)
    total = sum(layer.nbytes for layer in spec.model.expanded())
    budget = int(total * SMOKE_BUDGET_SHARE[key]) if args.smoke else BUDGETS[key]
    ids = {name: inputs(item, name, config.vocab_size, device) for name, item in workloads.items()}
    return Case(key, master, config, spec, total, budget, ids)


def floor(run: Run, case: Case, modes: tuple[str, ...]) -> None:
    """The unoffloaded model: the reference logits, the floor step times and the link bound."""
    with torch.no_grad():
        for w, ids in case.inputs.items():
            case.refs[w] = case.master(ids, use_cache=False).logits.clone()
    rows = run_contender(run, case, "no offload", "floor", lambda m: Applied(m), list(case.inputs), modes=modes,
                         use_master=True)
    for (w, mode), row in rows.items():
        if mode == "eager" and row["status"] == "ok":
            case.floor_ms[w] = row["step_ms"]
            if row.get("peak_gpu_bytes") is not None:
                case.floor_peak[w] = row["peak_gpu_bytes"]
    must_move = max(0, case.total_bytes - case.budget)
    for w in case.inputs:
        if run.h2d_gbps and w in case.floor_ms:
            case.link_bound_ms[w] = round(max(case.floor_ms[w], must_move / (run.h2d_gbps * 1e6)), 3)
    run.write({"type": "case", "model": case.key, "total_bytes": case.total_bytes, "budget": case.budget,
               "must_move_bytes": must_move, "h2d_gbps": run.h2d_gbps, "floor_ms": case.floor_ms,
               "floor_peak_gpu_bytes": case.floor_peak, "link_bound_ms": case.link_bound_ms,
               "tokens": {w: int(ids.numel()) for w, ids in case.inputs.items()}})


def ours(run: Run, case: Case, args, workloads: Workload, modes: tuple[str, ...], hand: bool) -> None:
    """``auto``'s plans (``hand`` False) or the predicted-fastest hand plans (``hand`` True)."""
    from compare_ours import apply_plan, auto_plans, best_hand_plans, hand_candidates, plan_fields

    if not hand and "ours" not in args.skip:
        for group in auto_plans(case.spec, case.budget, workloads):
            run_contender(run, case, "ours auto", "ours", apply_plan(group.plan, run.device), group.names,
                          modes=modes, extra={"budget_raised_to": group.raised}, per_workload=group.fields)
    if hand and "hand" not in args.skip:
        candidates = hand_candidates(case.spec, case.budget, workloads, moe=case.key == "moe")
        for label, plan, names in best_hand_plans(candidates, list(case.inputs)):
            run_contender(run, case, f"ours {plan.summary.backend} (best hand plan)", "ours",
                          apply_plan(plan, run.device), names, modes=modes, extra={"plan_label": label},
                          per_workload=plan_fields(plan, names))


def naive(run: Run, case: Case) -> None:
    from compare_naive import NaiveOffloader, plan_layers
    from compare_ours import plan_at

    plan, raised = plan_at(case.spec, case.budget, backend="prefetch", strategy="budget")
    layers = plan_layers(plan)

    def setup(model) -> Applied:
        offloader = NaiveOffloader(model, layers, run.device)
        return Applied(model, {"moved_bytes": offloader.host_bytes, "offloaded_layers": len(layers)},
                       offloader.remove)

    run_contender(run, case, "naive (sync copy per layer)", "naive", setup, list(case.inputs),
                  extra={"budget_raised_to": raised})


def dispatch(run: Run, case: Case) -> None:
    from compare_accelerate import dispatch as accelerate_dispatch

    run_contender(run, case, "accelerate dispatch_model", "accelerate",
                  lambda m: Applied(m, accelerate_dispatch(m, case.budget, run.device)), list(case.inputs))


def cpu_offload(run: Run, case: Case) -> None:
    from compare_accelerate import cpu_offload as accelerate_cpu_offload

    run_contender(run, case, "accelerate cpu_offload", "accelerate",
                  lambda m: Applied(m, accelerate_cpu_offload(m, run.device)), list(case.inputs))


def _diffusers_setup(name: str, device: torch.device):
    from compare_diffusers import apply

    def setup(model) -> Applied:
        if needs_cuda(name) and device.type != "cuda":
            raise Skip("use_stream needs a CUDA device")
        return Applied(model, apply(model, name, device))
    return setup


def sweep(run: Run, case: Case, args, names: list[str]) -> dict[str, dict]:
    """diffusers configurations ``names`` on decode b=1 (sweep rows); their rows by configuration."""
    swept = {}
    for name in names:
        got = run_contender(run, case, f"diffusers {name}", "diffusers", _diffusers_setup(name, run.device),
                            ["decode"], extra={"sweep": True, "diffusers_config": name},
                            profile=name in args.profile_diffusers)
        swept[name] = got[("decode", "eager")]
    return swept


def diffusers(run: Run, case: Case, args, best: str | None) -> dict | None:
    """Sweep the first-pass configurations on decode (unless ``best`` is already known), then run the fastest
    on every workload. Returns the best configuration's rows by workload."""
    first, rest = "decode", [w for w in case.inputs if w != "decode"]
    rows: dict[str, dict] = {}
    if best is None:
        swept = sweep(run, case, args, first_pass(args.diffusers_configs, run.device))
        ok = {n: r for n, r in swept.items() if r["status"] == "ok"}
        if not ok:
            return None
        best = min(ok, key=lambda n: ok[n]["step_ms"])
        rows[first] = {**ok[best], "contender": f"diffusers best ({best})", "sweep": False, "from_sweep": True}
        run.write(rows[first])
        rest_names = rest
    else:
        rest_names = list(case.inputs)
    got = run_contender(run, case, f"diffusers best ({best})", "diffusers", _diffusers_setup(best, run.device),
                        rest_names, extra={"diffusers_config": best})
    rows.update({w: r for (w, _), r in got.items()})
    rows["best"] = best
    return rows


def first_pass(names: list[str], device: torch.device) -> list[str]:
    """The configurations swept before the best one is chosen: those diffusers documents for speed (streams,
    given the decoder stack or at leaf level). The others (no stream, or block level on the whole causal LM,
    which finds no block) take 12-13 s a step on Llama-3-8B (measured 2026-11-30) and run in the second
    pass, when every model's main rows are in. Without CUDA (a smoke run) streams cannot run: the others first."""
    if device.type != "cuda":
        return [n for n in names if not needs_cuda(n)] or list(names)
    fast = [n for n in names if CONFIGS[n].get("use_stream") and (CONFIGS[n]["target"] == "model"
                                                                   or CONFIGS[n]["offload_type"] == "leaf_level")]
    return fast or list(names)


def compile_row(run: Run, case: Case, workloads: Workload) -> None:
    from compare_ours import apply_plan, plan_at, plan_fields

    item = Workload({"decode": dict(workloads.root)["decode"]})
    plan, raised = plan_at(case.spec, case.budget, strategy="auto", workload=item)
    run_contender(run, case, "ours auto", "ours", apply_plan(plan, run.device), ["decode"], modes=("compile",),
                  extra={"budget_raised_to": raised}, per_workload=plan_fields(plan, ["decode"]))


def diffusers_and_ours_at(run: Run, case: Case, args, workloads: Workload, state: dict) -> None:
    """diffusers (swept on the first model, its best configuration after), then ``auto`` at its memory."""
    if state["diffusers_best"] == "":
        skip_row(run, case, "diffusers best", "diffusers", "decode", "no configuration ran on the first model")
        return
    rows = diffusers(run, case, args, state["diffusers_best"])
    state["diffusers_best"] = "" if rows is None else rows.pop("best")
    if rows is not None and "at-diffusers" not in args.skip:
        from compare_ours_at import ours_at

        ours_at(run, case, workloads, rows, "diffusers best")


def guarded(run: Run, model: str, section: str, fn, *args):
    """``fn(*args)``; an exception becomes an ``error`` line (and False) instead of ending the run."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - one section's failure is a result, the others still run
        traceback.print_exc()
        run.write({"type": "error", "model": model, "section": section, "error": repr(exc)[:500]})
        print(f"{model}: section {section} failed: {exc!r}", flush=True)
        return False


def preload() -> None:
    """Import the contenders' libraries now and freeze what exists into gc's permanent generation, so the
    collection after each contender scans only what that contender made (a full scan of transformers',
    diffusers' and accelerate's objects takes most of a second)."""
    for name in ("accelerate", "diffusers.hooks"):
        try:
            __import__(name)
        except ImportError:
            pass
    gc.collect()
    gc.freeze()


def compare_all(run: Run, args, keys: list[str], workloads: Workload, modes: tuple[str, ...]) -> None:
    """Three passes, so that a run cut short by its time budget still has every model's main rows: first
    each model's floor, ``auto``, Accelerate's dispatch_model and diffusers' best (swept over the fast
    configurations) with ``auto`` at its memory; then the best hand plans, the naive offloader and the rest
    of the diffusers sweep; then cpu_offload and torch.compile."""
    device = run.device
    cases: dict[str, Case] = {}
    state = {"diffusers_best": None}
    for key in keys:
        case = guarded(run, key, "build", make_case, key, args, device, workloads)
        gc.collect()
        gc.freeze()
        if not isinstance(case, Case):
            continue
        print(f"--- {key}: {case.total_bytes / 1e9:.2f} GB, budget {case.budget / 1e9:.2f} GB "
              f"({run.elapsed():.0f} s)", flush=True)
        if guarded(run, key, "floor", floor, run, case, modes) is not False:
            cases[key] = case
    for key, case in cases.items():
        guarded(run, key, "ours", ours, run, case, args, workloads, modes, False)
        if "dispatch" not in args.skip:
            guarded(run, key, "dispatch", dispatch, run, case)
        if "diffusers" not in args.skip:
            guarded(run, key, "diffusers", diffusers_and_ours_at, run, case, args, workloads, state)
    swept_on = next(iter(cases), None)  # the model the diffusers sweep ran on
    for key, case in cases.items():
        guarded(run, key, "hand", ours, run, case, args, workloads, modes, True)
        if "naive" not in args.skip:
            guarded(run, key, "naive", naive, run, case)
        rest = [n for n in args.diffusers_configs if n not in first_pass(args.diffusers_configs, device)]
        if key == swept_on and "diffusers" not in args.skip and state["diffusers_best"] and rest:
            guarded(run, key, "diffusers sweep", sweep, run, case, args, rest)
    for key, case in cases.items():
        if "cpu_offload" not in args.skip:
            guarded(run, key, "cpu_offload", cpu_offload, run, case)
    if device.type == "cuda" and "llama" in cases and "compile" not in args.skip and run.left_s() > 120:
        guarded(run, "llama", "compile", compile_row, run, cases["llama"], workloads)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available (use --device cpu --smoke for a CPU run)",
              file=sys.stderr)
        return 2
    workloads = SMOKE_WORKLOADS if args.smoke else WORKLOADS
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    cuda = device.type == "cuda"
    modes = ("eager", "graph") if cuda and "graph" not in args.skip else ("eager",)
    keys = [args.only] if args.only else ["llama", "moe"]
    try:
        with open(out_path, "w") as out:
            run = Run(device, out, args.time_budget, slow_s=args.slow_step, cap_s=args.step_cap,
                      profile_dir=out_path.parent, graph_max_tokens=args.graph_max_tokens)
            run.write(environment(device, args))
            preload()
            run.h2d_gbps = h2d_gbps(device)
            print(f"pinned host-to-GPU: {run.h2d_gbps} GB/s; host {host_snapshot().get('MemAvailable')} B available",
                  flush=True)
            compare_all(run, args, keys, workloads, modes)
            run.write({"type": "done", "elapsed_s": round(run.elapsed(), 1)})
    finally:
        gc.unfreeze()  # an in-process caller (the tests) gets its objects back to collectable
    print(f"done in {run.elapsed():.0f} s: {out_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
