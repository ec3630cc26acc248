"""Bad input: every case ends in exit 2 and a message naming the file, line and field, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from cli_samples import TINY_SPEC, invoke, tiny_plan


def spec_with(old: str, new: str, count: int = 1) -> str:
    """TINY_SPEC with one edit (the edit must apply, so a case never tests the good spec by mistake)."""
    assert old in TINY_SPEC, old
    return TINY_SPEC.replace(old, new, count)


def plan_text(**changes: object) -> str:
    data = tiny_plan((1, 3))
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = data
        for key in path:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return yaml.safe_dump(data, sort_keys=False)


@dataclass
class Case:
    id: str
    text: str | bytes | None  # written to bad.yaml; None: no file
    args: tuple[str, ...] = ("validate", "{f}")
    expect: tuple[str, ...] = field(default_factory=tuple)


CASES = [
    Case("malformed-yaml", spec_with("weight: [100, 8]\n    - name: blocks", "weight: [100, 8\n    - name: blocks"),
         expect=("bad.yaml:8:", "malformed YAML", "started on line 7")),
    Case("tab-indent", spec_with("  name: tiny", "\tname: tiny"), expect=("bad.yaml:2:", "tab")),
    Case("unknown-top-level-key", spec_with("offload:", "offlaod:"),
         expect=("bad.yaml:21:", "offlaod", "did you mean 'offload'")),
    Case("misspelled-model-key", spec_with("  dtype: float16", "  dtyp: float16"),
         expect=("bad.yaml:3:", "model.dtyp", "did you mean 'dtype'")),
    Case("misspelled-layer-key", spec_with("repeat: 4", "reapet: 4"),
         expect=("bad.yaml:9:", "model.layers[1].reapet", "did you mean 'repeat'")),
    Case("misspelled-param-key", spec_with("        weight: [100, 8]\nmemory", "        weight: {shape: [100, 8], dtpye: float16}\nmemory"),
         expect=("bad.yaml:16:", "model.layers[2].params.weight.dtpye", "did you mean 'dtype'")),
    Case("misspelled-memory-key", spec_with("gpu_budget: 2KB", "gpu_budgt: 2KB"),
         expect=("bad.yaml:18:", "memory.gpu_budgt", "did you mean 'gpu_budget'")),
    Case("misspelled-offload-key", spec_with("backend: uva", "backnd: uva"),
         expect=("bad.yaml:22:", "offload.backnd", "did you mean 'backend'")),
    Case("unknown-key-no-close-match", spec_with("backend: uva", "backend: uva\n  colour: red"),
         expect=("bad.yaml:23:", "offload.colour", "expected one of: backend, strategy")),
    Case("unparseable-size", spec_with("2KB", "12 GX"), expect=("bad.yaml:18:", "memory.gpu_budget", "'12 GX'")),
    Case("negative-size", spec_with("2KB", "-5GB"), expect=("bad.yaml:18:", "memory.gpu_budget", "positive")),
    Case("zero-size", spec_with("2KB", "0"), expect=("bad.yaml:18:", "memory.gpu_budget", "must be > 0")),
    Case("unknown-dtype", spec_with("dtype: float16", "dtype: float17"),
         expect=("bad.yaml:3:", "model.dtype", "unknown dtype 'float17'", "did you mean")),
    Case("repeat-without-token", spec_with("name: blocks.{i}", "name: blocks"),
         expect=("bad.yaml:8:", "model.layers[1]", "has repeat but its name has no {i}")),
    Case("token-without-repeat", spec_with("      repeat: 4\n", ""),
         expect=("bad.yaml:8:", "model.layers[1]", "no repeat")),
    Case("repeat-zero", spec_with("repeat: 4", "repeat: 0"),
         expect=("bad.yaml:9:", "model.layers[1].repeat", "must be > 0 (got 0)")),
    Case("duplicate-layer-names", spec_with("name: head", "name: embed"),
         expect=("bad.yaml:14:", "model.layers[2]", "duplicate layer name 'embed'")),
    Case("expanded-name-collides", spec_with("name: head", "name: blocks.2"),
         expect=("bad.yaml:", "duplicate layer name 'blocks.2'")),
    Case("duplicate-yaml-key", spec_with("  name: tiny\n", "  name: tiny\n  name: other\n"),
         expect=("bad.yaml:3:", "model.name: duplicate key", "line 2")),
    Case("tied-to-missing-param", spec_with("        weight: [100, 8]\nmemory", "        weight: [100, 8]\n      tied: {bias: embed.bias}\nmemory"),
         expect=("bad.yaml:14:", "model.layers[2]", "tied param 'bias' points to 'embed.bias'")),
    Case("num-in-group-over-group-size", spec_with("backend: uva", "backend: uva\n  strategy: group\n  group_size: 2\n  num_in_group: 3"),
         expect=("bad.yaml:21:", "offload", "num_in_group (3) is larger than group_size (2)")),
    Case("prefetch-step-zero", spec_with("backend: uva", "backend: prefetch\n  prefetch_step: 0"),
         expect=("bad.yaml:23:", "offload.prefetch_step", "must be > 0")),
    Case("group-without-group-size", spec_with("backend: uva", "strategy: group"),
         expect=("bad.yaml:21:", "strategy 'group' needs group_size")),
    Case("empty-layers", "model:\n  name: x\n  dtype: bf16\n  layers: []\n",
         expect=("bad.yaml:4:", "model.layers", "at least 1")),
    Case("negative-dim", spec_with("mlp.w1: [32, 8]", "mlp.w1: [32, -8]"),
         expect=("bad.yaml:11:", "params['mlp.w1'].shape[1]", "must be >= 0")),
    Case("non-int-dim", spec_with("mlp.w2: [8, 32]", "mlp.w2: [8, 3.5]"),
         expect=("bad.yaml:12:", "params['mlp.w2'].shape[1]", "whole number")),
    Case("stride-rank-mismatch", spec_with("norm.weight: [8]", "norm.weight: {shape: [8, 2], stride: [1]}"),
         expect=("bad.yaml:13:", "params['norm.weight']", "stride has 1 entries but shape has 2")),
    Case("empty-param-segment", spec_with("mlp.w1: [32, 8]", "mlp..w1: [32, 8]"),
         expect=("bad.yaml:10:", "model.layers[1].params", "empty segment")),
    Case("unknown-backend-in-file", spec_with("backend: uva", "backend: cuda"),
         expect=("bad.yaml:22:", "offload.backend", "'prefetch'", "'cuda'")),
    Case("empty-offload-params", spec_with("backend: uva", "backend: uva\n  params: []"),
         expect=("bad.yaml:23:", "offload.params", "params is empty")),
    Case("model-is-a-list", "model: [1, 2]\n", expect=("bad.yaml:1:", "model", "expected a mapping")),
    Case("missing-model", "memory: {gpu_budget: 1GB}\n", expect=("bad.yaml:1:", "model", "required key is missing")),
    Case("multiple-documents", TINY_SPEC + "---\nmodel: {}\n", expect=("bad.yaml:23:", "single document")),
    Case("recursive-alias", "model: &m\n  name: x\n  self: *m\n", expect=("bad.yaml:3:", "recursive")),
    Case("nested-too-deeply", "model: " + "[" * 5000 + "]" * 5000 + "\n", expect=("bad.yaml", "nested too deeply")),
    Case("empty-file", "", expect=("bad.yaml", "empty")),
    Case("comments-only-file", "# nothing here\n", expect=("bad.yaml", "empty")),
    Case("top-level-list", "- model\n- memory\n", expect=("bad.yaml:1:", "top level is a list")),
    Case("top-level-scalar", "hello\n", expect=("bad.yaml:1:", "top level is a str")),
    Case("binary-garbage", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", expect=("bad.yaml", "not a text file")),
    Case("nul-bytes-in-text", "model:\n  name: \x00x\n", expect=("bad.yaml:2:", "not a text file")),
    Case("missing-file", None, expect=("bad.yaml", "no such file")),
    Case("directory", None, args=("validate", "{d}"), expect=("is a directory",)),
    Case("plan-given-to-plan", plan_text(), args=("plan", "{f}", "--gpu-budget", "1GB"),
         expect=("bad.yaml:1:", "this is a plan file, not a spec")),
    Case("spec-given-to-show", TINY_SPEC, args=("show", "{f}"), expect=("bad.yaml:1:", "this is a spec file, not a plan")),
    Case("spec-given-to-diff", TINY_SPEC, args=("diff", "{f}", "{f}"), expect=("this is a spec file, not a plan",)),
    Case("plan-bad-backend", plan_text(summary__backend="cuda"), args=("show", "{f}"),
         expect=("bad.yaml:", "summary.backend", "'cuda'")),
    Case("plan-offloads-unknown-param", plan_text(layers__1__offloaded=["mlp.w9"]), args=("show", "{f}"),
         expect=("bad.yaml:48:", "layers[1].offloaded[0]", "'mlp.w9' is not a param of this layer")),
    Case("plan-inconsistent-summary", plan_text(summary__offloaded_bytes=5), args=("validate", "{f}"),
         expect=("bad.yaml:10:", "summary.offloaded_bytes: 5 in the file, 2048 from")),
    Case("plan-missing-summary-field", plan_text(summary__model=None), args=("show", "{f}"),
         expect=("bad.yaml:", "summary.model", "expected a string")),
    Case("diff-missing-file", None, args=("diff", "{f}", "{f}"), expect=("no such file",)),
    Case("cli-size-abc", TINY_SPEC, args=("plan", "{f}", "--gpu-budget", "abc"), expect=("--gpu-budget", "'abc'")),
    Case("cli-size-negative", TINY_SPEC, args=("plan", "{f}", "--cpu-budget", "-5GB"), expect=("--cpu-budget", "positive")),
    Case("cli-size-zero", TINY_SPEC, args=("plan", "{f}", "--gpu-budget", "0"), expect=("--gpu-budget", "must be > 0")),
    Case("cli-bad-format", TINY_SPEC, args=("plan", "{f}", "--format", "xml"), expect=("--format", "xml")),
    Case("cli-bad-backend", TINY_SPEC, args=("plan", "{f}", "--backend", "cuda"), expect=("--backend", "cuda")),
    Case("cli-bad-strategy", TINY_SPEC, args=("plan", "{f}", "--strategy", "greedy"), expect=("--strategy",)),
    Case("cli-group-size-zero", TINY_SPEC, args=("plan", "{f}", "--group-size", "0"), expect=("--group-size",)),
    Case("cli-show-bad-format", plan_text(), args=("show", "{f}", "--format", "html"), expect=("--format",)),
    Case("cli-diff-bad-format", plan_text(), args=("diff", "{f}", "{f}", "--format", "pdf"), expect=("--format",)),
    Case("cli-schema-bad-kind", None, args=("schema", "model"), expect=("model",)),
    Case("cli-unknown-command", None, args=("plna",), expect=("plna",)),
]


def _run_case(case: Case, tmp_path: Path):
    f = tmp_path / "bad.yaml"
    if isinstance(case.text, bytes):
        f.write_bytes(case.text)
    elif case.text is not None:
        f.write_text(case.text)
    args = [a.format(f=f, d=tmp_path) for a in case.args]
    return invoke(*args)


def test_cases_are_distinct() -> None:
    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids) >= 30
    inputs = [(c.text, c.args) for c in CASES]
    assert len({repr(i) for i in inputs}) == len(inputs)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_with_a_clear_message(case: Case, tmp_path: Path) -> None:
    result = _run_case(case, tmp_path)
    out = result.output
    assert result.exit_code == 2, (result.exit_code, out, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out
    for fragment in case.expect:
        assert fragment in out, f"{fragment!r} not in:\n{out}"


def test_many_errors_are_listed_one_a_line_and_capped(tmp_path: Path) -> None:
    layers = "".join(f"    - name: l{i}\n      repeat: 0\n" for i in range(15))
    f = tmp_path / "many.yaml"
    f.write_text(f"model:\n  name: m\n  dtype: bf16\n  layers:\n{layers}")
    result = invoke("validate", str(f))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 11 and lines[-1].endswith("more problems")
    assert lines[0].startswith(f"error: {f}:6: model.layers[0].repeat: must be > 0")
    assert lines[1].startswith(f"error: {f}:8: model.layers[1].repeat")


def test_tab_indented_json_is_read_as_json(tmp_path: Path) -> None:
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(yaml.safe_load(TINY_SPEC), indent="\t"))
    result = invoke("validate", str(f))
    assert result.exit_code == 0, result.output
    f.write_text(json.dumps({"model": {"name": "x"}}, indent="\t").replace('"x"', '"x",'))
    result = invoke("validate", str(f))
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_json_input_errors_name_the_line(tmp_path: Path) -> None:
    data = yaml.safe_load(TINY_SPEC)
    data["offload"]["backnd"] = data["offload"].pop("backend")
    f = tmp_path / "spec.json"
    text = json.dumps(data, indent=2)
    f.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "backnd" in ln)
    result = invoke("validate", str(f))
    assert result.exit_code == 2
    assert f"spec.json:{line}: offload.backnd: unknown key (did you mean 'backend'?)" in result.output


def test_stdin_errors_are_named_stdin() -> None:
    result = invoke("validate", "-", stdin=spec_with("repeat: 4", "repeat: -1"))
    assert result.exit_code == 2
    assert "<stdin>:9: model.layers[1].repeat: must be > 0 (got -1)" in result.output


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    f = tmp_path / "secret.yaml"
    f.write_text(TINY_SPEC)
    f.chmod(0)
    result = invoke("validate", str(f))
    assert result.exit_code == 2 and "permission denied" in result.output


@pytest.mark.parametrize("case_id", ["misspelled-offload-key", "binary-garbage", "cli-bad-format", "missing-file"])
def test_real_process_has_no_traceback(case_id: str, tmp_path: Path) -> None:
    case = next(c for c in CASES if c.id == case_id)
    f = tmp_path / "bad.yaml"
    if isinstance(case.text, bytes):
        f.write_bytes(case.text)
    elif case.text is not None:
        f.write_text(case.text)
    args = [a.format(f=f, d=tmp_path) for a in case.args]
    proc = subprocess.run([sys.executable, "-m", "planner.cli.app", *args], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for fragment in case.expect:
        assert fragment in proc.stderr
