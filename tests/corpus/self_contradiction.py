"""Hand edits that contradict the rest of the file: predictions that no forward of the plan on its own
profile can have (schemas/prediction_check.py), and rank sets whose plans disagree (a world size, the
shapes of one split) (schemas/rank_plans.py)."""

from __future__ import annotations

from pathlib import Path

from corpus.case import CliCase
from corpus.explain import PLAN
from corpus.tp import _set

from schemas.yaml_lines import load_data
from schemas.yaml_write import dump_yaml


def _edited(edit) -> str:
    data = load_data(PLAN)
    edit(data["predictions"])
    return dump_yaml(data)


def _row(**fields):
    return lambda preds: preds["workloads"][0].update(fields)


def _plan(id: str, edit, *expect: str, command: str = "validate") -> CliCase:
    return CliCase(f"contradiction-{id}", (command, "{d}/plan.yaml"), files={"plan.yaml": _edited(edit)},
                   expect=("plan.yaml:", *expect))


def _second_decode(preds) -> None:
    preds["workloads"].append(dict(preds["workloads"][0]))


def _ranks(edit):
    def then(folder: Path) -> None:
        path = folder / "rank1.plan.yaml"
        data = load_data(path.read_text())
        edit(data)
        path.write_text(dump_yaml(data))
    return then


def _world_one(data) -> None:
    data["summary"]["world_size"] = 1
    data["summary"]["rank"] = 0


def _transposed(data) -> None:
    param = data["layers"][1]["params"]["mlp.w1"]
    param["shape"] = list(reversed(param["shape"]))


CASES = [
    _plan("step-shorter-than-copy", _row(step_ms=0.001, cpu_ms=0.001), "predictions.workloads[0].step_ms",
          "shorter than the copy stream's busy time"),
    _plan("step-shorter-than-cpu", _row(step_ms=0.1), "predictions.workloads[0].step_ms", "the CPU's time"),
    _plan("step-shorter-in-diff", _row(step_ms=0.001, cpu_ms=0.001), "predictions.workloads[0].step_ms",
          command="show"),
    _plan("copy-not-at-link-rate", _row(copy_ms=0.0001), "predictions.workloads[0].copy_ms",
          "at the profile's link rate"),
    _plan("copy-cheaper-calls-claimed", lambda p: p["profile"].update(copy_call_us=0.1),
          "predictions.workloads[0].copy_ms", "0.0224 in the file"),
    _plan("bound-not-the-largest", _row(bound="copy"), "predictions.workloads[0].bound", "cpu is the largest"),
    _plan("weighted-step-edited", lambda p: p.update(weighted_step_ms=0.05), "predictions.weighted_step_ms",
          "averaged with their weights"),
    _plan("offloaded-layers-edited", lambda p: p.update(offloaded_layers=7), "predictions.offloaded_layers",
          "7 in the file, 2 from"),
    _plan("workload-twice", _second_decode, "predictions.workloads[1].workload", "predicted twice"),
    _plan("hardware-name-not-the-profile", lambda p: p.update(hardware="a100"), "predictions.hardware",
          "'a100' in the file, 'h200' from predictions.profile.name"),
    CliCase("contradiction-rank-world-one-validate", ("validate", "{d}/set/rank1.plan.yaml"),
            setup=_set(2, _ranks(_world_one)), expect=("rank1.plan.yaml", "world_size is 1", "2 rank plans")),
    CliCase("contradiction-rank-world-one-validate-folder", ("validate", "{d}/set"),
            setup=_set(2, _ranks(_world_one)), expect=("rank1.plan.yaml", "world_size is 1")),
    CliCase("contradiction-rank-other-shapes-show", ("show", "{d}/set"), setup=_set(2, _ranks(_transposed)),
            expect=("rank1.plan.yaml", "layers[1].params['mlp.w1']", "parts of one shape")),
    CliCase("contradiction-rank-other-shapes-validate", ("validate", "{d}/set/rank0.plan.yaml"),
            setup=_set(2, _ranks(_transposed)), expect=("rank1.plan.yaml", "parts of one shape")),
]
