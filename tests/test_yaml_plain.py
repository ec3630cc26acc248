"""The plain block YAML reader (schemas/yaml_plain.py): whatever it reads, it reads exactly as PyYAML's parser
path does (same values, same types, same key order); whatever it cannot, it leaves to that path, so every
message for bad input stays PyYAML's. Checked on the bundled specs, on tricky lines, and on random documents
and random edits of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.synthetic_spec import synthetic_spec_text
from schemas import yaml_lines
from schemas.yaml_lines import YamlProblem
from schemas.yaml_plain import read_plain
from schemas.yaml_write import dump_yaml

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "examples").rglob("*.yaml"))


def _pyyaml_path(text: str) -> Any:
    """What ``load_data`` gives without the plain reader (PyYAML's parser), or the YamlProblem it raises."""
    try:
        return yaml_lines._load_events(text, None)
    except yaml_lines._NeedLines:
        return yaml_lines.load_with_lines(text)[0]
    except (yaml_lines._Unsupported, yaml.YAMLError):
        return yaml_lines._load_nodes(text)[0]


def _typed(value: Any) -> Any:
    """``value`` with every scalar's type beside it and dicts as lists of items, so that 1, 1.0 and True
    (equal in Python) and key order are told apart."""
    if isinstance(value, dict):
        return ("dict", [(_typed(k), _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    return (type(value).__name__, value)


def _check(text: str) -> Any:
    """read_plain(text) is None, or PyYAML's path reads the text to the same data."""
    got = read_plain(text)
    if got is None:
        return None
    try:
        want = _pyyaml_path(text)
    except YamlProblem as problem:
        raise AssertionError(f"read {got!r}, PyYAML's path refuses: {problem}") from None
    assert _typed(got) == _typed(want), text
    return got


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_bundled_specs_read_the_same(path: Path) -> None:
    _check(path.read_text())


def test_the_large_synthetic_spec_is_read_here() -> None:
    text = synthetic_spec_text(50, 20, gpu_budget="10GiB")
    assert _check(text) is not None


@pytest.mark.parametrize("text", [
    "a: 1\nb:\n  - x\n  - y\n",
    "a:\n- x\n- y\nb: 2\n",  # a sequence at its key's indent
    "- a: 1\n  b: [1, 2]\n- c\n-\n- d: {x: 1, y: [2]}\n",
    "- params:\n  - a\n  - b\n  k: v\n",
    "a:\nb:\n",  # nulls
    "a: # comment\n  b: 1  # another\n# at the margin\n   # indented\nc: d\n",
    "k: on\nl: No\nm: null\no: 0o17\np: 0x1F\nq: 1_000\nr: .5\ns: 1e3\nt: .inf\nu: 2026-12-02\n",
    "v: -3\nw: +4\nx: 012\ny: 1.5e+3\nz: model.layers.{i}\n",
    "true: 1\nnull: 2\n",
    "a:  \n  x: 1\n",
    "  a: 1\n  b: 2\n",  # an indented root
    "a: [ 1 , 2 ]\nb: []\nc: {}\nd: { k: v }\n",
    "# a comment … in UTF-8, ×\na: 1  # é\n",
])
def test_tricky_documents_are_read_as_pyyaml_reads_them(text: str) -> None:
    assert _check(text) is not None


@pytest.mark.parametrize("text", [
    "a: 1\na: 2\n",  # a duplicate key: PyYAML's path names both lines
    "a: {x: 1, x: 2}\n",
    "a: 'quoted'\n", 'a: "q"\n', "a: &x 1\nb: *x\n", "a: !!str 1\n", "a: |\n  text\n", "a: >\n  text\n",
    "a: two words\n", "a: b: c\n", "a:\tb\n", "a: 1\r\nb: 2\r\n", "a: x\n  continued\n",
    "a: 1\n  b: 2\n", "- a\nb: 1\n", "a:\n  - x\n  b: 1\n", "---\na: 1\n", "a: 1\n...\n", "just a scalar\n",
    "a: [1, [2]]\n", "a: [x: 1]\n", "a: value#not-a-comment\n", "a: " + "9" * 150 + "\n",
    "a: 2026-02-31\n", "a: 1 # \x07\n", "# \u2028\na: 1\n", "a: 1  # \x85\n", "a: 1 # \ufeff\n", "", "# only a comment\n", "a: [1, 2,]\n", "? a\n: b\n", "a: é\n", "a: -\n", "- - a\n",
    "k" * 1001 + ": 1\n",
])
def test_other_documents_are_left_to_pyyaml(text: str) -> None:
    assert read_plain(text) is None


_WORDS = ["a", "b", "name", "weight", "x.y", "on", "null", "y", "No", "true", "model.layers.{i}", "1", "0o17", "012",
          "1_000", "0x1F", ".inf", ".5", "1e3", "-3", "+4", "2026-12-02", "10GiB", "bfloat16", "a/b", "_", "-x"]
_SCALARS = st.one_of(st.sampled_from(_WORDS), st.integers(-10**6, 10**6), st.booleans(), st.none(),
                     st.sampled_from([1.5, 0.25, -2.0]))
_DATA = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_WORDS), inner, max_size=4)), max_leaves=16)


def _texts(data: Any) -> list[str]:
    texts = [dump_yaml(data)]
    for flow in (False, None):
        for indent in (2, 4):
            texts.append(yaml.safe_dump(data, default_flow_style=flow, indent=indent, sort_keys=False))
    return texts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DATA)
def test_random_documents_read_the_same(data: Any) -> None:
    for text in _texts(data):
        _check(text)


_EDITS = [" ", "  ", "-", "- ", ":", ": ", "#", " #", "[", "]", "{", "}", ",", "\n", "\n  ", "a", "1", "'", '"',
          "\t", "&", "*", "!", "|", "?", "{i}", ".", "é", "…", "\x85", "\u2028", "\ufeff", "\x07", "\r"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DATA, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3), st.sampled_from(_EDITS)), min_size=1,
                       max_size=4))
def test_random_edits_read_the_same_or_are_left_to_pyyaml(data: Any, edits: list[tuple[int, int, str]]) -> None:
    text = dump_yaml({"model": data, "layers": [data, {"params": data}]})
    for at, cut, insert in edits:
        at %= len(text) + 1
        text = text[:at] + insert + text[at + cut:]
    _check(text)
