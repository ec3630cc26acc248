"""Planner speed on a generated 1,000-layer x 20-param spec: YAML load, plan, dump; and the CLI.

Stages: parsing the spec text (the plain block reader schemas.yaml_plain that loading uses; PyYAML's
event stream in schemas.yaml_lines, with libyaml's parser and with the pure-Python one, without and
with the line map; the old composer-based loader for comparison), validating it, planning, turning
the plan into data, writing YAML/JSON, then ``planner plan`` and ``planner --help`` as subprocesses.

Run: python bench/bench_plan.py [--layers 1000] [--params 20] [--repeat 5]
Prints the best of ``--repeat`` runs of each stage, in seconds.

``--command ROOT [ROOT ...]`` times the `planner plan` command instead: a new process each run, the trees
taken in turn (interleaved, so that a machine whose speed drifts affects each alike), ``--repeat`` runs of
each; per tree the min and median of each stage, wall and CPU seconds: start (the interpreter and importing
the command line), imports (what the command imports before reading the spec: pydantic, the schemas, the
planner), load (read, parse, validate), plan (``planner.plan``), dump (plan to text), write, and the whole
process (``total``, as ``/usr/bin/time`` sees it). Compile the bytecode of each tree first
(``python -m compileall -q planner schemas``), as an installed package has it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
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
from schemas import yaml_lines, yaml_plain  # noqa: E402
from schemas.io import plan_data  # noqa: E402


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def parse_with(parser: type, text: str, lines: bool) -> object:
    """The event-stream path of schemas.yaml_lines with ``parser`` (not the plain reader load_data tries first)."""
    old, yaml_lines._PARSER = yaml_lines._PARSER, parser
    try:
        return yaml_lines.load_with_lines(text) if lines else yaml_lines._load_events(text, None)
    finally:
        yaml_lines._PARSER = old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--params", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--budget", default="10GiB", help="gpu_budget: about half the blocks get offloaded")
    ap.add_argument("--skip-slow", action="store_true", help="skip the old composer-based loader (seconds)")
    ap.add_argument("--command", nargs="+", metavar="ROOT", help="time the `planner plan` command's stages, one "
                    "process a run, for each tree (interleaved)")
    args = ap.parse_args()
    text = synthetic_spec_text(args.layers, args.params, gpu_budget=args.budget)
    if args.command:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "spec.yaml"
            path.write_text(text)
            command_stages(args.command, path, Path(tmp), args.repeat)
        return
    rows = []
    c_parser = getattr(yaml, "CSafeLoader", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(text)
        rows.append(("parse spec: schemas.yaml_plain (what loading uses)",
                     best(lambda: yaml_plain.read_plain(text), args.repeat)[0]))
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
        if (ROOT / "planner" / "cli").is_dir():
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


# One run of the command in a new process with a timer around each stage (argv: the tree's root, the spec, the
# plan to write); prints {stage: [wall s, CPU s]} as one JSON line on stderr as the command ends.
STAGES = """
import json, os, sys, time
root, spec, out = sys.argv[1:4]
sys.path.insert(0, root)
marks = {}
def mark(label, w, c):
    m = marks.setdefault(label, [0.0, 0.0])
    m[0] += time.perf_counter() - w
    m[1] += time.process_time() - c
w, c = time.perf_counter(), time.process_time()
import planner.cli.app as app
mark("start", w, c)
if hasattr(app, "PLUGINS_ENV"):  # as main() does before anything imports pydantic
    os.environ.setdefault(app.PLUGINS_ENV, "__all__")
w, c = time.perf_counter(), time.process_time()
import schemas.io, planner, planner.cli.plan_command, planner.cli.output, planner.tp.cli
mark("imports", w, c)
def timed(module, name, label):
    f = getattr(module, name)
    def run(*a, **k):
        w, c = time.perf_counter(), time.process_time()
        try:
            return f(*a, **k)
        finally:
            mark(label, w, c)
    setattr(module, name, run)
timed(schemas.io, "load_model", "load")
timed(planner, "plan", "plan")
timed(schemas.io, "dump_model", "dump")
timed(planner.cli.output, "emit", "write")
def report(code):
    print(json.dumps(marks), file=sys.stderr)
    real_exit(code)
real_exit, os._exit = os._exit, report
sys.argv = ["planner", "plan", spec, "-o", out]
app.main()
"""
STAGE_NAMES = ("start", "imports", "load", "plan", "dump", "write", "other", "timed run", "command")


def _child_times(cmd: list[str], cwd: str) -> tuple[float, float, str]:
    """(wall s, CPU s of the process, its stderr) of ``cmd`` run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=cwd))
    wall = time.perf_counter() - w
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} in {cwd}: exit {proc.returncode}: {proc.stderr[-400:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, proc.stderr


def command_stages(roots: list[str], spec: Path, tmp: Path, repeat: int) -> None:
    """The `planner plan` command on ``spec`` for each tree: each round runs, tree by tree, the command as it is
    (``command``: the process's wall and CPU) and once more with a timer around each stage (``timed run``: that
    process's; ``other``: what it has beyond the stages: the interpreter's start and end, typer's parsing)."""
    runs: dict[str, list[dict[str, list[float]]]] = {r: [] for r in roots}
    for _ in range(repeat):
        for root in roots:
            out = str(tmp / "plan.yaml")
            command = _child_times([sys.executable, "-m", "planner.cli", "plan", str(spec), "-o", out], root)
            timed = _child_times([sys.executable, "-c", STAGES, root, str(spec), out], root)
            stages = json.loads(timed[2].strip().splitlines()[-1])
            stages["other"] = [timed[i] - sum(v[i] for v in stages.values()) for i in (0, 1)]
            stages["timed run"] = list(timed[:2])
            stages["command"] = list(command[:2])
            runs[root].append(stages)
    print(f"`planner plan SPEC -o PLAN`, {repeat} runs a tree, interleaved; seconds, min / median")
    print(f"{'stage':<16}" + "".join(f"{r[-28:]:>32}" for r in roots))
    for name in STAGE_NAMES:
        for i, what in enumerate(("wall", "CPU")):
            cells = []
            for root in roots:
                xs = [run[name][i] for run in runs[root] if name in run]
                cells.append(f"{min(xs):.3f} / {statistics.median(xs):.3f}" if xs else "-")
            print(f"{name + ' ' + what:<16}" + "".join(f"{c:>32}" for c in cells))


if __name__ == "__main__":
    main()
