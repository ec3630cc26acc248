"""CLI start-up: wall time of `planner --help` (median of N fresh processes) and whether torch is imported.

Run: python bench/bench_cli.py [--runs 10]
The target (issue 2) is < 0.3 s and no torch import. Prints a markdown table for docs/BENCHMARKS.md
and exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import sys
import time

TARGET_S = 0.3
HEAVY = ("torch", "networkx", "pydantic", "planner.build")


def wall_times(cmd: list[str], runs: int) -> list[float]:
    subprocess.run(cmd, capture_output=True, check=True)  # warm the file cache once, not timed
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def imported_after_help() -> list[str]:
    """Heavy modules in sys.modules after the CLI has imported and rendered --help."""
    code = (
        "import sys\n"
        "from planner.cli.app import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    return [m for m in last.split(",") if m in HEAVY]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    script = shutil.which("planner")
    commands = {"planner --help": [script, "--help"]} if script else {}
    commands["python -m planner.cli.app --help"] = [sys.executable, "-m", "planner.cli.app", "--help"]
    commands["python -c pass (interpreter floor)"] = [sys.executable, "-c", "pass"]

    print(f"machine: {platform.machine()}, {platform.system()}, Python {platform.python_version()}, "
          f"runs: {args.runs}\n")
    print("| command | median s | min s | max s |")
    print("|---|---:|---:|---:|")
    ok = True
    for label, cmd in commands.items():
        t = wall_times(cmd, args.runs)
        med = statistics.median(t)
        print(f"| `{label}` | {med:.3f} | {min(t):.3f} | {max(t):.3f} |")
        if label.endswith("--help") and med >= TARGET_S:
            ok = False
    heavy = imported_after_help()
    print(f"\nimported by `planner --help`: torch {'yes' if 'torch' in heavy else 'no'}; "
          f"heavy modules: {', '.join(heavy) or 'none'} (checked: {', '.join(HEAVY)})")
    ok = ok and "torch" not in heavy
    print(f"target < {TARGET_S} s and no torch: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
