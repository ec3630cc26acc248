"""Caps on the size of a spec (schemas/spec_limits.py) and strict whole numbers (schemas/ints.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

import schemas.spec
from schemas import spec_limits
from schemas.io import load_model
from schemas.spec import SpecFile


def spec(layers: list[dict[str, Any]], **sections: Any) -> dict[str, Any]:
    return {"model": {"name": "m", "dtype": "bfloat16", "layers": layers}, **sections}


def template(repeat: int, params: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": "blocks.{i}", "repeat": repeat, "params": {f"w{k}": [4] for k in range(params)}, **extra}


def errors(data: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    with pytest.raises(ValidationError) as info:
        SpecFile.model_validate(data)
    return [(tuple(e["loc"]), e["msg"]) for e in info.value.errors(include_url=False)]


@pytest.fixture
def no_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a spec gets as far as expanding its layers."""
    def refuse(model: Any) -> Any:
        raise AssertionError("expanded a spec that the caps should have refused")

    monkeypatch.setattr(schemas.spec, "_expand", refuse)


def test_ten_million_layers_are_refused_before_expansion(no_expansion: None) -> None:
    [(loc, msg)] = errors(spec([{"name": "embed", "params": {"w": [4]}}, template(10_000_000)]))
    assert loc == ("model",)
    assert "expands to 10,000,001 layers, more than the 100,000 supported" in msg
    assert "layers[1] 'blocks.{i}' (repeat 10,000,000)" in msg


def test_too_many_params_are_refused_before_expansion(no_expansion: None) -> None:
    [(_, msg)] = errors(spec([template(100_000, params=21)]))
    assert "expands to 2,100,000 params and tied names, more than the 2,000,000 supported" in msg
    assert "(21 params x repeat 100,000)" in msg


def test_many_entries_without_repeat_count_too(no_expansion: None) -> None:
    layers = [{"name": f"l{i}", "params": {}} for i in range(spec_limits.MAX_LAYERS + 1)]
    [(_, msg)] = errors(spec(layers))
    assert f"expands to {spec_limits.MAX_LAYERS + 1:,} layers" in msg


def test_tied_names_count_as_params(no_expansion: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_limits, "MAX_PARAMS", 10)
    entry = template(5, params=1, tied={"v": "blocks.{i}.w0"})  # 5 x (1 param + 1 tie) = 10: at the cap
    layers = [entry, {"name": "head", "params": {"w": [4]}}]  # one more
    [(_, msg)] = errors(spec(layers))
    assert "expands to 11 params and tied names, more than the 10 supported" in msg


def test_the_caps_are_inclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_limits, "MAX_LAYERS", 6)
    monkeypatch.setattr(spec_limits, "MAX_PARAMS", 12)
    ok = SpecFile.model_validate(spec([template(4, params=2), {"name": "a", "params": {"w": [1], "v": [1]}},
                                       {"name": "b", "params": {"w": [1], "v": [1]}}]))
    assert len(ok.model.expanded()) == 6


def test_the_benchmark_size_validates() -> None:
    """bench/ plans 10,000 layers of 20 params: well inside the caps."""
    layers = [{"name": "embed", "params": {"weight": [32000, 1024]}}, template(10_000, params=20)]
    model = SpecFile.model_validate(spec(layers)).model
    assert len(model.expanded()) == 10_001
    assert sum(len(layer.params) for layer in model.expanded()) == 200_001


def test_a_tensor_over_a_pebibyte_is_refused() -> None:
    [(loc, msg)] = errors(spec([{"name": "embed", "params": {"w": [2**25, 2**25]}}]))  # 2^50 elements x 2 B
    assert loc == ("model",)
    assert "layers[0] 'embed': param 'w' takes 2048.00 TiB (bfloat16), more than the 1 PiB" in msg


def test_a_tensor_of_astronomical_size_is_refused_without_printing_it() -> None:
    [(_, msg)] = errors(spec([{"name": "embed", "params": {"w": [2**40, 2**40, 2**40]}}]))
    assert "about 2^121 bytes" in msg


def test_a_strided_tensor_counts_its_span() -> None:
    [(_, msg)] = errors(spec([{"name": "a", "params": {"w": {"shape": [2, 2], "stride": [2**50, 1]}}}]))
    assert "param 'w' takes" in msg


def test_the_model_total_is_capped() -> None:
    [(_, msg)] = errors(spec([template(2000, params=0) | {"params": {"w": [2**20, 2**20]}}]))
    assert "the model's params and buffers take 4000.00 TiB, more than the 1 PiB (2^50 bytes) supported" in msg


def test_a_dimension_beyond_int64_is_refused_at_the_dimension() -> None:
    [(loc, msg)] = errors(spec([{"name": "a", "params": {"w": [10**32, 10**23]}}]))[:1]
    assert loc == ("model", "layers", 0, "params", "w", "shape", 0)
    assert "at most 2^63-1 (got a 107-bit number)" in msg


def test_a_huge_int_from_python_is_refused_without_printing_it() -> None:
    [(_, msg)] = errors(spec([template(1, start=10**5000)]))
    assert "16610-bit number" in msg


# ---------------------------------------------------------------------------
# strict whole numbers: every int field of a spec

def _param_field(field: str, value: Any) -> dict[str, Any]:
    param: dict[str, Any] = {"shape": [4, 4]}
    if field == "shape":
        param["shape"] = [value, 4]
    elif field == "stride":
        param["stride"] = [value, 1]
    return spec([{"name": "a", "params": {"w": param}}])


INT_FIELDS = {
    "shape": (lambda v: _param_field("shape", v), ("model", "layers", 0, "params", "w", "shape", 0)),
    "stride": (lambda v: _param_field("stride", v), ("model", "layers", 0, "params", "w", "stride", 0)),
    "repeat": (lambda v: spec([template(v)]), ("model", "layers", 0, "repeat")),
    "start": (lambda v: spec([template(2, start=v)]), ("model", "layers", 0, "start")),
    "group_size": (lambda v: spec([template(2)], offload={"strategy": "group", "group_size": v}),
                   ("offload", "group_size")),
    "num_in_group": (lambda v: spec([template(2)], offload={"group_size": 2, "num_in_group": v}),
                     ("offload", "num_in_group")),
    "prefetch_step": (lambda v: spec([template(2)], offload={"prefetch_step": v}), ("offload", "prefetch_step")),
}


@pytest.mark.parametrize("field", sorted(INT_FIELDS))
@pytest.mark.parametrize("value", [True, False, "4", 4.0, 2.5, [4], "0x4"], ids=repr)
def test_int_fields_take_ints_only(field: str, value: Any) -> None:
    make, loc = INT_FIELDS[field]
    SpecFile.model_validate(make(2))  # the same spec with an int is fine
    found = errors(make(value))
    assert any(got[: len(loc)] == loc for got, _ in found), found


@pytest.mark.parametrize("field", sorted(INT_FIELDS))
def test_int_fields_stop_at_int64(field: str) -> None:
    make, loc = INT_FIELDS[field]
    found = errors(make(2**63))
    assert any(got[: len(loc)] == loc and "at most 2^63-1" in msg for got, msg in found), found


@pytest.mark.parametrize("value", ["yes", 1, "true", None])
def test_buffer_is_a_bool_only(value: Any) -> None:
    [(loc, _)] = errors(spec([{"name": "a", "params": {"w": {"shape": [4], "buffer": value}}}]))
    assert loc == ("model", "layers", 0, "params", "w", "buffer")


@pytest.mark.parametrize("value", [True, 1.5e10, -5, 0, "12GB;rm", "1e-3", "1,5GB"], ids=repr)
@pytest.mark.parametrize("field", ["gpu_budget", "cpu_budget"])
def test_sizes_in_the_memory_section_use_the_one_parser(field: str, value: Any) -> None:
    [(loc, _)] = errors(spec([template(2)], memory={field: value}))
    assert loc == ("memory", field)


# ---------------------------------------------------------------------------
# numbers the YAML reader refuses before validation


@pytest.mark.parametrize("text, fragment", [
    ("9" * 5000, "a number of more than 100 digits"),
    ("0x" + "f" * 5000, "a number of more than 100 digits"),
    ("2020-13-45", "cannot read '2020-13-45' as a timestamp"),
])
def test_unreadable_scalars_are_input_errors_with_a_line(tmp_path: Any, text: str, fragment: str) -> None:
    from schemas.errors import InputError

    path = tmp_path / "s.yaml"
    path.write_text(f"model:\n  name: m\n  dtype: bf16\n  layers:\n    - name: a\n      repeat: {text}\n")
    with pytest.raises(InputError) as info:
        load_model(SpecFile, path)
    assert f"{path}:6: " in str(info.value) and fragment in str(info.value)
