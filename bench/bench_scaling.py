"""How planning time grows with the number of layers: planner.plan and `planner plan` end to end.

Specs (bench/synthetic_spec.py), each block listed on its own: ``dense`` (20 params a block) and
``moe`` (DeepSeek-like, planned with ``prefer: [routed_experts, dense_mlp]``). Budgets: ``1MB``
(infeasible: the error names the smallest feasible budget, which the search must find exactly),
``half`` (half the model's bytes: about half the blocks offloaded) and ``tiny`` (the smallest
feasible budget: every block offloaded with UVA, or a tight prefetch plan). Backends auto,
prefetch and uva.

Run: python bench/bench_scaling.py [--layers 1000 2000 5000 10000 20000] [--repeat 3] [--no-cli]
Prints a markdown table of the best of ``--repeat`` runs: wall seconds and CPU seconds (the VM is
shared, so CPU time is the steadier number), and the growth factor from the previous size.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import planner  # noqa: E402
from bench.synthetic_spec import moe_spec_text, synthetic_spec_text  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402
from schemas import load_spec  # noqa: E402

PREFER = ["routed_experts", "dense_mlp"]
SPECS = {"dense": (synthetic_spec_text, None), "moe": (moe_spec_text, PREFER)}


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """Best wall and CPU seconds of ``repeat`` calls, and the last result (or the error raised)."""
    wall, cpu, out = [], [], None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        try:
            out = fn()
        except InfeasibleError as err:
            out = err
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu), out


def cli_timed(argv: list[str], repeat: int) -> tuple[float, float, int]:
    """Best wall and CPU (user + sys) seconds of ``planner plan`` as a fresh process, and its exit code."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    wall, cpu, code = [], [], 0
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        code = subprocess.run([sys.executable, "-m", "planner.cli.app", *argv], capture_output=True, env=env).returncode
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(wall), min(cpu), code


def outcome(result: object) -> str:
    if isinstance(result, InfeasibleError):
        return f"infeasible (min {result.min_gpu_budget})"
    s = result.summary  # type: ignore[attr-defined]
    return f"{s.backend}, {s.offloaded_layers} offloaded"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, nargs="+", default=[1000, 2000, 5000, 10000, 20000])
    ap.add_argument("--specs", nargs="+", default=list(SPECS), choices=list(SPECS))
    ap.add_argument("--backends", nargs="+", default=["auto", "prefetch", "uva"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-cli", action="store_true", help="skip the `planner plan` subprocess runs")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}, Python "
          f"{platform.python_version()}; load average {os.getloadavg()[0]:.1f}; best of {args.repeat}\n")
    print("| spec | budget | layers | backend | what | wall s | CPU s | CPU growth | outcome |")
    print("|---|---|---:|---|---|---:|---:|---:|---|")
    previous: dict[tuple, tuple[int, float]] = {}

    def row(key: tuple, layers: int, wall: float, cpu: float, result: str) -> None:
        growth = ""
        if key in previous:
            n0, c0 = previous[key]
            growth = f"{cpu / c0:.2f} (x{layers / n0:g} layers)" if c0 > 0 else ""
        previous[key] = (layers, cpu)
        print("| " + " | ".join([*key[:2], str(layers), *key[2:], f"{wall:.3f}", f"{cpu:.3f}", growth, result]) + " |",
              flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        for name in args.specs:
            text_of, prefer = SPECS[name]
            for layers in args.layers:
                path = Path(tmp) / f"{name}-{layers}.yaml"
                path.write_text(text_of(layers))
                spec = load_spec(path)
                total = sum(layer.nbytes for layer in spec.model.expanded())
                try:
                    planner.plan(spec, gpu_budget=10**6, prefer=prefer)
                    raise SystemExit("1MB should be infeasible")
                except InfeasibleError as err:
                    tiny = err.min_gpu_budget
                budgets = {"1MB": 10**6, "half": total // 2, "tiny": tiny}
                for label, budget in budgets.items():
                    for backend in args.backends:
                        wall, cpu, result = timed(lambda: planner.plan(spec, gpu_budget=budget, backend=backend,
                                                                        prefer=prefer), args.repeat)
                        row((name, label, backend, "planner.plan"), layers, wall, cpu, outcome(result))
                if args.no_cli:
                    continue
                for label in ("1MB", "half"):
                    argv = ["plan", str(path), "--gpu-budget", str(budgets[label]), "-o", str(Path(tmp) / "plan.yaml")]
                    if prefer:
                        argv += ["--prefer", ",".join(prefer)]
                    wall, cpu, code = cli_timed(argv, args.repeat)
                    row((name, label, "auto", "`planner plan` (CLI)"), layers, wall, cpu, f"exit {code}")


if __name__ == "__main__":
    main()
