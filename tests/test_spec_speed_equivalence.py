"""Loading a spec fast gives what the plain reading of it says (schemas/spec_cache.py, spec_names.py,
schemas/io.py's gc_paused, the expansion in schemas/spec.py): each distinct param validated once, never confused
with input that only looks alike, and errors the same however warm the memo is."""

from __future__ import annotations

import gc
import math
import random
from typing import Any

import pytest
from pydantic import ValidationError

from schemas import spec_cache, spec_names
from schemas.dtypes import DTYPE_BYTES, canonical_dtype
from schemas.io import load_spec
from schemas.spec import SpecFile
from schemas.spec_layers import ParamSpec, Tensor, _VALID_PARAMS
from schemas.yaml_lines import load_data, load_with_lines
from schemas.yaml_write import dump_yaml

DTYPES = ["float16", "bf16", "float32", "torch.int8", "float8_e4m3fn"]
NAMES = ["w", "b", "attn.q.weight", "mlp.up.weight", "norm.weight", "experts.0.w"]


def random_param(rng: random.Random) -> Any:
    """A param in one of the forms a spec may use, often repeating content met before."""
    shape = [rng.choice([1, 2, 8, 0, 4096]) for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.5:
        return shape
    out: dict[str, Any] = {"shape": shape}
    if rng.random() < 0.4:
        out["dtype"] = rng.choice(DTYPES)
    if rng.random() < 0.3 and shape:
        out["stride"] = [rng.choice([1, 2, 8]) for _ in shape]
    if rng.random() < 0.3:
        out["buffer"] = rng.random() < 0.5
    if rng.random() < 0.3:
        out["kind"] = rng.choice(["attention", "norm", "other"])
    if rng.random() < 0.2:
        out["shard"] = rng.choice(["replicated", "dim0"])
    return out


def random_spec(rng: random.Random) -> dict[str, Any]:
    layers = []
    for n in range(rng.randint(1, 12)):
        names = rng.sample(NAMES, rng.randint(0, len(NAMES)))
        layer: dict[str, Any] = {"name": f"model.layers.{n}", "params": {k: random_param(rng) for k in names}}
        if rng.random() < 0.3:
            layer = {**layer, "name": f"model.block{n}.{{i}}", "repeat": rng.randint(1, 3), "start": rng.randint(0, 2)}
        layers.append(layer)
    return {"model": {"name": "m", "dtype": rng.choice(DTYPES), "layers": layers}}


def expected_layers(data: dict[str, Any]) -> list[tuple[str, int, tuple[Tensor, ...]]]:
    """The expansion, worked out from the input alone."""
    model = data["model"]
    out = []
    for layer in model["layers"]:
        tensors = []
        for name, raw in layer["params"].items():
            p = {"shape": raw} if isinstance(raw, list) else raw
            shape = tuple(p["shape"])
            stride = tuple(p["stride"]) if "stride" in p else None
            dtype = canonical_dtype(p.get("dtype") or model["dtype"])
            elements = (math.prod(shape) if stride is None or 0 in shape
                        else 1 + sum((n - 1) * s for n, s in zip(shape, stride)))
            tensors.append(Tensor(name, shape, dtype, stride, p.get("buffer", False),
                                  elements * DTYPE_BYTES[dtype], p.get("kind")))
        if "repeat" in layer:
            names = [layer["name"].replace("{i}", str(i))
                     for i in range(layer["start"], layer["start"] + layer["repeat"])]
        else:
            names = [layer["name"]]
        out += [(name, len(out) + k, tuple(tensors)) for k, name in enumerate(names)]
    return out


@pytest.mark.parametrize("seed", range(40))
def test_random_specs_expand_as_written(seed: int) -> None:
    rng = random.Random(seed)
    data = random_spec(rng)
    if seed % 2:
        _VALID_PARAMS.items.clear()  # half the runs with a cold memo, half warm from the runs before
    spec = SpecFile.model_validate(data)
    got = [(layer.name, layer.index, layer.params) for layer in spec.model.expanded()]
    assert got == expected_layers(data)
    for layer, raw in zip(spec.model.layers, data["model"]["layers"]):
        for name, p in raw["params"].items():
            assert layer.params[name] == ParamSpec.model_validate(p)  # what validating it alone gives
            assert layer.params[name].model_fields_set == ({"shape"} if isinstance(p, list) else set(p))


@pytest.mark.parametrize("seed", range(10))
def test_a_spec_file_loads_to_the_same_spec_as_its_data(seed: int, tmp_path) -> None:
    data = random_spec(random.Random(100 + seed))
    path = tmp_path / "spec.yaml"
    path.write_text(dump_yaml(data))
    assert load_data(path.read_text()) == data == load_with_lines(path.read_text())[0]
    assert load_spec(path) == SpecFile.model_validate(data)


def refused(data: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """Each error's location and message."""
    with pytest.raises(ValidationError) as info:
        SpecFile.model_validate(data)
    return [(e["loc"], e["msg"]) for e in info.value.errors(include_url=False)]


def spec_of(*params: Any) -> dict[str, Any]:
    layers = [{"name": f"l{i}", "params": {"w": p}} for i, p in enumerate(params)]
    return {"model": {"name": "m", "dtype": "float16", "layers": layers}}


@pytest.mark.parametrize("good, bad", [
    ([1, 2], [True, 2]),  # True == 1 and hashes alike, but a bool is not a dimension
    ([1, 2], [1.0, 2]),
    ({"shape": [4], "buffer": True}, {"shape": [4], "buffer": 1}),
    ({"shape": [4], "buffer": False}, {"shape": [4], "buffer": 0}),
    ({"shape": [4], "dtype": "float16"}, {"shape": [4], "dtype": "float16", "stride": [1, 1]}),
    ({"shape": [4], "kind": "norm"}, {"shape": [4], "kind": "norms"}),
])
def test_content_that_only_looks_like_a_valid_param_is_still_refused(good: Any, bad: Any) -> None:
    """Validated after the good one (in the same spec and in an earlier one), the bad one gets the
    errors it gets on its own."""
    _VALID_PARAMS.items.clear()
    alone = refused(spec_of(bad))
    SpecFile.model_validate(spec_of(good))
    after = refused(spec_of(good, bad))
    assert alone and [msg for _, msg in after] == [msg for _, msg in alone]
    assert [loc[:2] + loc[3:] for loc, _ in after] == [loc[:2] + loc[3:] for loc, _ in alone]
    assert all(loc[2] == 1 for loc, _ in after)  # pointing at the second layer, the bad one


def test_a_bad_param_is_refused_every_time_and_names_each_layer() -> None:
    errors = refused(spec_of([1, -1], [1, 2], [1, -1]))
    assert [loc[2] for loc, _ in errors] == [0, 2]
    assert len({msg for _, msg in errors}) == 1


def test_param_names_are_checked_in_order_however_warm() -> None:
    data = {"model": {"name": "m", "dtype": "float16", "layers": [
        {"name": "a", "params": {"w": [1]}}, {"name": "b", "params": {"w": [1], "x..y": [1], " z": [1]}}]}}
    cold = (spec_names._passed.clear(), refused(data))[1]
    warm = refused(data)
    assert cold == warm and len(warm) == 1 and "'x..y' has an empty segment" in warm[0][1]


def test_content_key_tells_types_apart() -> None:
    key = spec_cache.content_key
    assert key([1, 2]) == key([1, 2]) and key({"shape": [1], "dtype": "f"}) == key({"shape": [1], "dtype": "f"})
    assert len({key([1, 2]), key([True, 2]), key([1.0, 2]), key({"shape": [1, 2]})}) == 4
    assert key((1, 2)) is None and key([[1], 2]) is None and key({1: [1]}) is None and key("x") is None


def test_the_memo_stays_bounded() -> None:
    memo = spec_cache.Memo(size=3)
    for n in range(10):
        memo.put(n, n)
        assert len(memo.items) <= 3 and memo.get(n) == n


@pytest.mark.parametrize("bad", [False, True])
def test_loading_restores_the_collector(bad: bool, tmp_path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("model: {name: m, dtype: float16, layers: [{name: a, params: {w: [%s]}}]}\n"
                    % ("-1" if bad else "1"))
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            try:
                load_spec(path)
            except Exception:
                assert bad
            assert gc.isenabled() is enabled
        finally:
            gc.enable()
