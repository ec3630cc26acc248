"""Issue 22 item 10 and issue 18's planning speed: end-to-end CLI times on large inputs, wall and CPU.

    python bench/bench_scale.py [--root DIR] [--runs N]

``--root``: the source tree to time (default this one; a checkout of an older commit gives "before").
Each case runs as a subprocess ``python -m planner.cli.app ...`` with PYTHONPATH=ROOT; best of N wall and
the child's user + sys CPU of that run. Inputs (bench/synthetic_spec.py) are written to a temp folder:
- plan auto: 1,000 blocks x 20 params, each listed on its own, --gpu-budget 10GiB (strategy auto);
- plan, 1,000 workloads: 32 blocks x 10 params and a workload section of 1,000 forwards;
- export --to vllm: a 2,000-block plan (budget strategy, prefetch) that no vLLM flags express;
- show: a 20,000-block plan (4 params a block);
- plan /dev/zero: refused at the input cap (schemas/input_file.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_spec import synthetic_spec_text  # noqa: E402

HERE = Path(__file__).resolve().parent.parent


def _run(root: Path, args: list[str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "planner.cli.app", *args], env={**os.environ, "PYTHONPATH": str(root)},
                          cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # -m puts cwd first
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=HERE)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated case names")
    opts = ap.parse_args()
    d = Path(tempfile.mkdtemp())
    (d / "s1000.yaml").write_text(synthetic_spec_text(1000, 20))
    (d / "s2000.yaml").write_text(synthetic_spec_text(2000, 20))
    (d / "s20000.yaml").write_text(synthetic_spec_text(20000, 4, hidden=256))
    workloads = "workload:\n" + "".join(f"  w{i}: {{tokens: {i + 1}, weight: 1}}\n" for i in range(1000))
    (d / "w1000.yaml").write_text(synthetic_spec_text(32, 10) + workloads)
    # the plans export and show read, made by this tree's planner
    _run(HERE, ["plan", str(d / "s2000.yaml"), "-g", "10GiB", "--strategy", "budget", "--backend", "prefetch",
                "-o", str(d / "p2000.yaml")])
    _run(HERE, ["plan", str(d / "s20000.yaml"), "-g", "1GiB", "--strategy", "budget", "-o", str(d / "p20000.yaml")])
    cases = {
        "plan-auto-1000x20": ["plan", str(d / "s1000.yaml"), "-g", "10GiB", "-o", str(d / "out.yaml")],
        "plan-1000-workloads": ["plan", str(d / "w1000.yaml"), "-g", "1GiB", "-o", str(d / "out.yaml")],
        "export-2000": ["export", str(d / "p2000.yaml"), "--to", "vllm"],
        "show-20000": ["show", str(d / "p20000.yaml")],
        "plan-dev-zero": ["plan", "/dev/zero"],
    }
    only = set(filter(None, opts.only.split(",")))
    for name, args in cases.items():
        if only and name not in only:
            continue
        runs = [_run(opts.root, args) for _ in range(opts.runs)]
        wall, cpu, rc = min(runs)
        print(f"{name}: best wall {wall:.2f} s, its CPU {cpu:.2f} s, exit {rc}; load {os.getloadavg()[0]:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
