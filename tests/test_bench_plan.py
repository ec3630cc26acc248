"""bench/bench_plan.py --command: the `planner plan` command's stages, timed in a new process a run (a small spec,
one run of this tree)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_plan  # noqa: E402
from bench.synthetic_spec import synthetic_spec_text  # noqa: E402


def test_every_stage_of_the_command_is_timed_and_the_plan_written(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(synthetic_spec_text(6, 3, gpu_budget="1GiB"))
    bench_plan.command_stages([str(ROOT)], spec, tmp_path, 1)
    lines = capsys.readouterr().out.splitlines()
    rows = {line[:16].strip(): line[16:].split() for line in lines[2:]}
    assert set(rows) == {f"{stage} {what}" for stage in bench_plan.STAGE_NAMES for what in ("wall", "CPU")}
    for stage in ("start", "imports", "load", "plan", "dump", "write", "timed run", "command"):
        assert float(rows[f"{stage} wall"][0]) > 0, stage
    assert float(rows["timed run wall"][0]) >= float(rows["plan wall"][0]) + float(rows["load wall"][0])
    assert yaml.safe_load((tmp_path / "plan.yaml").read_text())["summary"]["layers"] == 9  # the embedding, 6 blocks, the norm and the head
