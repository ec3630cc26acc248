"""Names and texts a command prints, read from a hardware profile or a plan: printable only, one rule
for all (schemas/spec_names.py, the spec names' rule), so no escape sequence reaches a terminal."""

from __future__ import annotations

from corpus.case import CliCase
from corpus.cost import PROFILE, _cli
from corpus.explain import PLAN

def _profile(id: str, old: str, new: str, *expect: str) -> CliCase:
    assert old in PROFILE, old
    return _cli(f"printed-profile-{id}", "--hardware", "{d}/gpu.yaml", files={"gpu.yaml": PROFILE.replace(old, new)},
                expect=("gpu.yaml:", *expect))


def _plan(id: str, old: str, new: str, *expect: str) -> CliCase:
    assert old in PLAN, old
    return CliCase(f"printed-plan-{id}", ("show", "{d}/plan.yaml"), files={"plan.yaml": PLAN.replace(old, new, 1)},
                   expect=("plan.yaml:", *expect))


CASES = [
    _profile("name-escape", "name: mine", 'name: "\\e[31mmine"', "name", "U+001B", "must be printable"),
    _profile("name-bell", "name: mine", 'name: "mine\\a"', "name", "U+0007"),
    _profile("name-bidi-override", "name: mine", 'name: "mi\\u202Ene"', "name", "U+202E"),
    _profile("name-zero-width", "name: mine", 'name: "mi\\u200Bne"', "name", "U+200B"),
    _profile("name-surrounding-spaces", "name: mine", 'name: " mine "', "name", "surrounding spaces"),
    _profile("name-empty", "name: mine", 'name: ""', "name", "must not be empty"),
    _profile("source-escape", "source: a test", 'source: "a \\e]0;title\\a test"', "source", "U+001B"),
    _plan("prediction-hardware-escape", "  hardware: h200", '  hardware: "\\e[2Jh200"', "predictions.hardware",
          "U+001B"),
    _plan("profile-name-escape", "    name: h200", '    name: "h200\\e[0m"', "predictions.profile.name", "U+001B"),
    _plan("model-escape", "model: tiny", 'model: "\\e[31mtiny"', "summary.model", "U+001B"),
    _plan("layer-name-escape", "- name: embed", '- name: "emb\\x1bed"', "layers[0].name", "U+001B"),
    _plan("param-name-escape", "weight: {shape: [100, 8]", '"w\\x9beight": {shape: [100, 8]', "params", "U+009B"),
    _plan("backend-reason-escape", "backend_reason: prefetch requested", 'backend_reason: "prefetch\\e[8m requested"',
          "summary.backend_reason", "U+001B"),
    _plan("workload-escape", "workload: decode", 'workload: "decode\\e[8m"', "memory.forwards[0].workload",
          "U+001B"),
]
CASES += [
    CliCase("printed-calibrate-name-escape", ("calibrate", "--name", "\x1b[31mgpu"), expect=("--name", "U+001B")),
    CliCase("printed-calibrate-name-empty", ("calibrate", "--name", ""), expect=("--name", "empty value")),
]
