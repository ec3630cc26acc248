"""Planner speed on a generated 1,000-layer x 20-param spec: YAML load, plan, dump; and the CLI.

Stages: parsing the spec text (schemas.yaml_lines, with libyaml's parser and with PyYAML's
pure-Python one, without and with the line map, and the old composer-based loader for
comparison), validating it, planning, turning the plan into data, writing YAML/JSON, then
``planner plan`` and ``planner --help`` as subprocesses.

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
from schemas import yaml_lines  # noqa: E402
from schemas.io import plan_data  # noqa: E402


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def parse_with(parser: type, text: str, lines: bool) -> object:
    old, yaml_lines._PARSER = yaml_lines._PARSER, parser
    try:
        return yaml_lines.load_with_lines(text) if lines else yaml_lines.load_data(text)
    finally:
        yaml_lines._PARSER = old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--params", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--budget", default="10GiB", help="gpu_budget: about half the blocks get offloaded")
    ap.add_argument("--skip-slow", action="store_true", help="skip the old composer-based loader (seconds)")
    args = ap.parse_args()
    text = synthetic_spec_text(args.layers, args.params, gpu_budget=args.budget)
    rows = []
    c_parser = getattr(yaml, "CSafeLoader", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(text)
        if c_parser is not None:
            rows.append(("parse spec: events, libyaml parser", best(lambda: parse_with(c_parser, text, False),
                                                                    args.repeat)[0]))
            rows.append(("parse spec + line map: events, libyaml", best(lambda: parse_with(c_parser, text, True),
                                                                        args.repeat)[0]))
        rows.append(("parse spec: events, pure-Python parser",
                     best(lambda: parse_with(yaml.SafeLoader, text, False), min(args.repeat, 2))[0]))
        if not args.skip_slow:
            rows.append(("parse spec + line map: old composer path", best(lambda: yaml_lines._load_nodes(text), 1)[0]))
        data = yaml_lines.load_data(text)
        rows.append(("SpecFile.model_validate", best(lambda: SpecFile.model_validate(data), args.repeat)[0]))
        t_load, spec = best(lambda: load_spec(path), args.repeat)
        rows.append(("schemas.load_spec (read + parse + validate)", t_load))
        t_plan, plan = best(lambda: planner.plan(spec), args.repeat)
        rows.append(("planner.plan", t_plan))
        rows.append(("schemas.io.plan_data (compact model_dump)", best(lambda: plan_data(plan), args.repeat)[0]))
        t_yaml, out = best(lambda: dump_model(plan, "yaml"), args.repeat)
        rows.append(("schemas.dump_model(plan, 'yaml')", t_yaml))
        t_json, _ = best(lambda: dump_model(plan, "json"), args.repeat)
        rows.append(("schemas.dump_model(plan, 'json')", t_json))
        rows.append(("load + plan + YAML dump (in process)", t_load + t_plan + t_yaml))
        if (ROOT / "planner" / "cli.py").exists():
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            runs = [(f"`planner plan --format {fmt}` subprocess",
                     ["plan", str(path), "-o", str(Path(tmp) / f"p.{fmt}"), "--format", fmt]) for fmt in ("yaml", "json")]
            runs.append(("`planner --help` subprocess", ["--help"]))
            for name, argv in runs:
                cmd = [sys.executable, "-m", "planner.cli.app", *argv]
                t, proc = best(lambda: subprocess.run(cmd, capture_output=True, env=env), max(args.repeat, 5))
                ok = "" if proc.returncode == 0 else f" (exit {proc.returncode}: {proc.stderr.decode()[-200:]})"
                rows.append((f"{name}{ok}", t))
    s = plan.summary
    print(f"spec: {args.layers} layers x {args.params} params ({len(text.splitlines())} YAML lines), "
          f"gpu_budget {args.budget}; plan: {s.backend}, {s.offloaded_layers} layers offloaded, "
          f"step {s.prefetch_step}, {len(out.splitlines())} YAML lines ({len(out.encode()):,} bytes); "
          f"libyaml: {c_parser is not None}")
    print(f"{'stage':<58} {'seconds':>8}")
    for name, t in rows:
        print(f"{name:<58} {t:>8.3f}")


if __name__ == "__main__":
    main()
