"""Planner speed on a generated 1,000-layer x 20-param spec: YAML load, plan, dump; and the CLI.

Run: python bench/bench_plan.py [--layers 1000] [--params 20] [--repeat 5]
Prints the best of ``--repeat`` runs of each stage, in seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

import planner  # noqa: E402
from bench.synthetic_spec import synthetic_spec_text  # noqa: E402
from schemas import SpecFile, dump_model, load_spec  # noqa: E402


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--params", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--budget", default="10GiB", help="gpu_budget: about half the blocks get offloaded")
    args = ap.parse_args()
    text = synthetic_spec_text(args.layers, args.params, gpu_budget=args.budget)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(text)
        t_load, spec = best(lambda: load_spec(path), args.repeat)
        rows.append(("schemas.load_spec (yaml.safe_load + validate)", t_load))
        c_loader = getattr(yaml, "CSafeLoader", None)
        if c_loader is not None:
            t, _ = best(lambda: SpecFile.model_validate(yaml.load(path.read_text(), Loader=c_loader)), args.repeat)
            rows.append(("load with libyaml CSafeLoader + validate", t))
        t_plan, plan = best(lambda: planner.plan(spec), args.repeat)
        rows.append(("planner.plan", t_plan))
        t_yaml, out = best(lambda: dump_model(plan, "yaml"), args.repeat)
        rows.append(("schemas.dump_model(plan, 'yaml')", t_yaml))
        t_json, _ = best(lambda: dump_model(plan, "json"), args.repeat)
        rows.append(("schemas.dump_model(plan, 'json')", t_json))
        rows.append(("load + plan + YAML dump (in process)", t_load + t_plan + t_yaml))
        rows.append(("load + plan (in process)", t_load + t_plan))
        if (ROOT / "planner" / "cli.py").exists():
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            for fmt in ("yaml", "json"):
                cmd = [sys.executable, "-m", "planner.cli", "plan", str(path), "-o", str(Path(tmp) / f"p.{fmt}"),
                       "--format", fmt]
                t, proc = best(lambda: subprocess.run(cmd, capture_output=True, env=env), min(args.repeat, 3))
                ok = "" if proc.returncode == 0 else f" (exit {proc.returncode}: {proc.stderr.decode()[-200:]})"
                rows.append((f"`planner plan --format {fmt}` subprocess{ok}", t))
    s = plan.summary
    print(f"spec: {args.layers} layers x {args.params} params ({len(text.splitlines())} YAML lines), "
          f"gpu_budget {args.budget}; plan: {s.backend}, {s.offloaded_layers} layers offloaded, "
          f"step {s.prefetch_step}, {len(out.splitlines())} YAML lines")
    print(f"{'stage':<58} {'seconds':>8}")
    for name, t in rows:
        print(f"{name:<58} {t:>8.3f}")


if __name__ == "__main__":
    main()
