"""The fast YAML paths of schemas/: event-built loading (libyaml or pure Python, same data and
lines), duplicate keys caught without the line map, the compact plan file, byte-identical output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from bench.synthetic_spec import synthetic_spec_text
from schemas import Plan, load_spec
from schemas import yaml_lines
from schemas.io import dump_model, load_model, plan_data
from schemas.yaml_lines import YamlProblem, load_data, load_with_lines
from schemas.yaml_write import dump_yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
HAS_LIBYAML = getattr(yaml, "CSafeLoader", None) is not None
PARSERS = [pytest.param(yaml.SafeLoader, id="pure-python")]
if HAS_LIBYAML:
    PARSERS.append(pytest.param(yaml.CSafeLoader, id="libyaml"))


@pytest.fixture(params=PARSERS)
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type:
    monkeypatch.setattr(yaml_lines, "_PARSER", request.param)
    return request.param


def _plans() -> dict[str, Plan]:
    llama = load_spec(ROOT / "examples" / "llama-3-8b.yaml")
    tied = load_spec(ROOT / "examples" / "llama-3.2-1b.yaml")
    return {
        "prefetch": planner.plan(llama, gpu_budget=12 * 10**9, backend="prefetch"),  # a previous_forward layer
        "prefetch-step-3": planner.plan(llama, gpu_budget=12 * 10**9, prefetch_step=3, backend="prefetch"),
        "uva": planner.plan(llama, gpu_budget=12 * 10**9, backend="uva"),
        "fits": planner.plan(llama, gpu_budget=10**12),
        "tied": planner.plan(tied, gpu_budget=2 * 10**9),
    }


PLANS = _plans()

ODD_YAML = """\
plain: text with spaces
quoted: "007"
single: 'yes'
ints: [0x1F, 0o17, 1_000, -3, +4]
floats: [1.5, .inf, -.inf, 1e3, 6.02e+23]
bools: [yes, No, on, OFF, true]
nulls: [~, null, ]
date: 2026-11-29
stamp: 2026-11-29 10:00:00
binary: !!binary aGVsbG8=
str_tag: !!str 123
empty_map: {}
empty_list: []
nested: {a: [1, [2, {b: c}]], "k: v": 'it''s'}
multi: |
  line one
  line two
folded: >
  folded
  text
1: int key
~: null key
list:
- - a
  - b
- key: value
  other: [x]
"""


# ---------------------------------------------------------------------------
# loading: the event builder gives what PyYAML's composer gives


def _texts() -> list[str]:
    plan = PLANS["prefetch"]
    verbose = yaml.safe_dump(plan.model_dump(mode="json"), sort_keys=False)
    return [p.read_text() for p in EXAMPLES] + [
        ODD_YAML, synthetic_spec_text(5, 4, gpu_budget="1GiB"), dump_model(plan), dump_model(plan, "json"),
        verbose, "just a scalar\n", "", "---\n", "[1, 2]\n",
    ]


@pytest.mark.parametrize("index", range(len(_texts())))
def test_event_builder_matches_the_pyyaml_composer(parser: type, index: int) -> None:
    text = _texts()[index]
    data, lines = load_with_lines(text)
    slow_data, slow_lines = yaml_lines._load_nodes(text)
    assert data == slow_data == yaml.safe_load(text)
    assert lines == slow_lines
    assert load_data(text) == data


def test_libyaml_and_pure_python_give_the_same_data_and_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    if not HAS_LIBYAML:
        pytest.skip("PyYAML without libyaml")
    for text in _texts():
        monkeypatch.setattr(yaml_lines, "_PARSER", yaml.CSafeLoader)
        c = load_with_lines(text)
        monkeypatch.setattr(yaml_lines, "_PARSER", yaml.SafeLoader)
        assert load_with_lines(text) == c


def test_the_event_builder_handles_the_common_documents_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Examples, specs and plans must not fall back to the slow composer (that would be seconds)."""

    def fail(text: str) -> None:
        raise AssertionError("fell back to _load_nodes")

    monkeypatch.setattr(yaml_lines, "_load_nodes", fail)
    for text in [p.read_text() for p in EXAMPLES] + [dump_model(PLANS["prefetch"]), ODD_YAML]:
        assert load_data(text) == yaml.safe_load(text)
        load_with_lines(text)


@pytest.mark.parametrize("text", [
    "base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\n",
    "a: &a [1, 2]\nb: *a\n",
    "--- !!omap\n- a: 1\n",
    "s: !!set {a, b}\n",
])
def test_anchors_merge_keys_and_tagged_collections_still_load(parser: type, text: str) -> None:
    """They go through the composer path, as before (a tagged collection is read as a plain one)."""
    expected = yaml_lines._load_nodes(text)
    assert load_data(text) == expected[0]
    assert load_with_lines(text) == expected
    if "<<" in text or "&" in text:
        assert expected[0] == yaml.safe_load(text)


@pytest.mark.parametrize("text, line, column, where", [
    ("a: 1\nb: 2\na: 3\n", 3, 1, ("a",)),
    ("top:\n  x: 1\n  y: 2\n  x: 3\n", 4, 3, ("top", "x")),
    ("m: {k: 1, k: 2}\n", 1, 11, ("m", "k")),
    ("l:\n- {p: 1}\n- p: 2\n  q: 3\n  p: 4\n", 5, 3, ("l", 1, "p")),
    ("1: a\n1: b\n", 2, 1, (1,)),
    ('{"a": 1, "a": 2}\n', 1, 10, ("a",)),
])
def test_duplicate_keys_are_rejected_on_the_fast_path(parser: type, text: str, line: int, column: int,
                                                      where: tuple) -> None:
    for load in (load_data, load_with_lines):
        with pytest.raises(YamlProblem) as err:
            load(text)
        assert "duplicate key" in err.value.message and (err.value.line, err.value.column) == (line, column)
        assert err.value.path == where


def test_a_duplicate_key_in_a_large_spec_names_both_lines(parser: type) -> None:
    text = synthetic_spec_text(50, 4).replace("attn.proj0.bias: [1024]", "attn.proj0.weight: [1024]", 1)
    with pytest.raises(YamlProblem) as err:
        load_data(text)
    first = text.splitlines().index("        attn.proj0.weight: [1024, 1024]") + 1
    assert err.value.line == first + 1 and f"first defined on line {first}" in err.value.message


@pytest.mark.parametrize("depth", [300, 200_000])
def test_deep_nesting_is_a_problem_not_a_crash(parser: type, depth: int) -> None:
    with pytest.raises(YamlProblem, match="nested too deeply"):
        load_data("a: " + "[" * depth + "]" * depth + "\n")


def test_a_non_scalar_key_is_a_problem(parser: type) -> None:
    with pytest.raises(YamlProblem, match="plain scalar") as err:
        load_data("a: 1\n? [x]\n: 2\n")
    assert err.value.line == 2


def test_malformed_yaml_still_gets_pyyamls_message(parser: type) -> None:
    with pytest.raises(YamlProblem) as err:
        load_data("a: [1, 2\nb: 3\n")
    assert err.value.message.startswith("malformed YAML") and err.value.line is not None


# ---------------------------------------------------------------------------
# the compact plan file


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_compact_plan_round_trips(name: str, fmt: str) -> None:
    plan = PLANS[name]
    text = dump_model(plan, fmt)
    assert load_model(Plan, "<p>", text) == plan
    assert dump_model(load_model(Plan, "<p>", text), fmt) == text


@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_verbose_form_still_loads(name: str) -> None:
    plan = PLANS[name]
    for data in (plan.model_dump(mode="json"), plan.model_dump(mode="json", exclude_none=True)):
        assert load_model(Plan, "<p>", yaml.safe_dump(data, sort_keys=False)) == plan
        assert load_model(Plan, "<p>", json.dumps(data)) == plan


def test_compact_plan_leaves_out_defaults_and_keeps_what_reviewers_need() -> None:
    plan = PLANS["prefetch"]
    text = dump_model(plan)
    for default in ("buffer: false", "stride: null", "tied: {}", "notes: []", "previous_forward: false",
                    ": null"):
        assert default not in text
    assert text.startswith("plan_version: 2\nsummary:\n")
    data = yaml.safe_load(text)
    assert list(data) == ["plan_version", "summary", "memory", "predictions", "layers", "buffer_pool"]
    for key in ("backend", "strategy", "prefetch_step", "gpu_budget_bytes", "resident_bytes", "offloaded_bytes",
                "buffer_bytes", "peak_gpu_bytes", "pinned_host_bytes", "spec_sha256"):
        assert key in data["summary"]
    assert all("name" in layer and "offloaded" in layer for layer in data["layers"])
    assert any(layer["offloaded"] == [] for layer in data["layers"])
    assert all("prefetch" in layer for layer in data["layers"] if layer["offloaded"])
    assert {"slots", "keys", "bytes"} <= set(data["buffer_pool"])
    # one line per param
    q = "      self_attn.q_proj.weight: {shape: [4096, 4096], dtype: bfloat16, bytes: 33554432}"
    assert text.splitlines().count(q) == 32
    assert "    prefetch: {slot: 0, copy_before: model.layers.30, previous_forward: true}" in text


@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_data_dumps_each_param_once_and_equals_the_whole_model_dump(name: str) -> None:
    """plan_data dumps each param object once and shares what layers repeat; the data is what dumping the whole
    plan gives (fields equal to their default left out, offloaded always there), and so is its YAML."""
    plan = PLANS[name]
    data = plan_data(plan)
    whole = plan.model_dump(mode="json", exclude_defaults=True)
    for layer in whole["layers"]:
        layer.setdefault("offloaded", [])
    fields = list(type(plan.layers[0]).model_fields)
    whole["layers"] = [{k: layer[k] for k in fields if k in layer} for layer in whole["layers"]]
    assert data == {"plan_version": plan.plan_version, **whole}
    assert [list(layer) for layer in data["layers"]] == [list(layer) for layer in whole["layers"]]
    unshared = json.loads(json.dumps(data))
    assert dump_yaml(data) == dump_yaml(unshared)
    params = [layer["params"] for layer in data["layers"]]
    assert len({id(p) for p in params}) < len(params)  # layers listing the same params share them


def test_the_writer_copies_a_value_met_again_only_at_the_same_indent() -> None:
    shared = {"a": [1, {"b": 2}], "c": {"d": [3, 4]}}
    data = {"x": shared, "y": {"z": shared}, "w": [shared, {"v": shared}], "u": shared}
    assert dump_yaml(data) == dump_yaml(json.loads(json.dumps(data)))
    assert yaml.safe_load(dump_yaml(data)) == data


def test_tied_params_and_notes_are_written_when_present() -> None:
    data = plan_data(PLANS["tied"])
    assert any(layer.get("tied") for layer in data["layers"])
    assert data["summary"]["notes"]


def test_plan_output_is_byte_identical_across_processes_and_yaml_backends(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(synthetic_spec_text(40, 6, gpu_budget="300MiB"))
    code = ("import sys, yaml\n"
            "if sys.argv[2] == 'pure':\n"
            "    del yaml.CSafeLoader; yaml.__with_libyaml__ = False\n"
            "import planner, schemas\n"
            "from schemas import yaml_lines\n"
            "assert (yaml_lines._PARSER is yaml.SafeLoader) == (sys.argv[2] == 'pure')\n"
            "sys.stdout.write(schemas.dump_model(planner.plan(schemas.load_spec(sys.argv[1])), sys.argv[3]))\n")
    for fmt in ("yaml", "json"):
        outs = {subprocess.run([sys.executable, "-c", code, str(spec), mode, fmt], capture_output=True, text=True,
                               check=True, cwd=ROOT).stdout
                for mode in (["c", "c", "pure"] if HAS_LIBYAML else ["pure", "pure"])}
        assert len(outs) == 1
        assert dump_model(planner.plan(load_spec(spec)), fmt) in outs


# ---------------------------------------------------------------------------
# the writer reads back as the same data, whatever the strings hold

_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=40)
            | st.floats(allow_nan=False) | st.sampled_from(["yes", "null", "~", "1e3", "0x10", "-", "a: b", "#x",
                                                           "[a]", "{", "'q'", '"', "a\nb", " lead", "trail ",
                                                           "\t", "\x85", "\u2028", "é", "😀", "", "- x", "..."]))
_keys = st.text(max_size=30) | st.integers(-5, 5) | st.sampled_from(["yes", "1", "null", "a.b", "x: y"])
_data = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_keys, inner, max_size=4), max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _data, min_size=1, max_size=5))
def test_dump_yaml_reads_back_equal(data: dict) -> None:
    text = dump_yaml(data)
    assert yaml.load(text, Loader=yaml.SafeLoader) == data
    if HAS_LIBYAML:
        assert yaml.load(text, Loader=yaml.CSafeLoader) == data
    assert load_data(text) == data
