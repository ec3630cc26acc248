"""Every tensor name belongs to one entry, and a tie points straight at a param (schemas/spec_ties.py)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import WEIGHTS_ONLY
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import planner
from schemas.spec import SpecFile


def model(*layers: dict[str, Any]) -> dict[str, Any]:
    return {"model": {"name": "m", "dtype": "float16", "layers": list(layers)}, "memory": dict(WEIGHTS_ONLY)}


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        SpecFile.model_validate(data)
    [error] = info.value.errors(include_url=False)
    return str(error["msg"])


EMBED = {"name": "model.embed", "params": {"weight": [100, 8]}}
BLOCK = {"name": "model.layers.{i}", "repeat": 2, "params": {"mlp.w": [8, 8]}}


def test_a_tied_name_another_layer_lists_with_the_target_shape_is_the_tie() -> None:
    """``model`` ties ``lm_head.weight`` while ``model.lm_head`` lists ``weight`` with the target's shape: the tie
    wins (the storage is counted once, at its owner), whichever layer comes first."""
    head = {"name": "model.lm_head", "params": {"weight": [100, 8], "bias": [100]}}
    tie = {"name": "model", "tied": {"lm_head.weight": "model.embed.weight"}}
    for layers in ((EMBED, tie, head), (EMBED, head, tie)):
        spec = SpecFile.model_validate(model(*layers))
        found = {layer.name: layer for layer in spec.model.expanded()}
        assert [t.name for t in found["model.lm_head"].params] == ["bias"]
        assert found["model"].tied == {"lm_head.weight": "model.embed.weight"}
        assert planner.plan(spec, gpu_budget=10**6).summary.total_bytes == (800 + 100) * 2


def test_a_tied_name_listed_with_another_shape_is_refused_naming_both() -> None:
    msg = refused(model(EMBED, {"name": "model", "tied": {"lm_head.weight": "model.embed.weight"}},
                        {"name": "model.lm_head", "params": {"weight": [3, 3]}}))
    assert ("layer 'model.lm_head': param 'weight' has shape [3, 3], but layer 'model' ties it to "
            "'model.embed.weight', whose shape is [100, 8]") in msg


def test_one_tensor_listed_by_two_nested_layers_is_refused() -> None:
    msg = refused(model({"name": "a", "params": {"b.w": [4]}}, {"name": "a.b", "params": {"w": [4]}}))
    assert "layer 'a.b': param 'w' is the tensor 'a.b.w', and layer 'a' lists it as param 'b.w'" in msg


def test_one_name_tied_by_two_nested_layers_is_refused() -> None:
    msg = refused(model(EMBED, {"name": "a", "tied": {"b.w": "model.embed.weight"}},
                        {"name": "a.b", "tied": {"w": "model.embed.weight"}}))
    assert "layer 'a.b': tied param 'w' is the tensor 'a.b.w', and layer 'a' ties it as tied param 'b.w'" in msg


def test_a_clash_inside_a_template_expansion_is_refused() -> None:
    msg = refused(model(BLOCK, {"name": "model.layers", "params": {"1.mlp.w": [8, 8]}}))
    assert "the tensor 'model.layers.1.mlp.w'" in msg


def test_a_tie_to_itself_is_refused() -> None:
    msg = refused(model(EMBED, {"name": "head", "params": {"b": [8]}, "tied": {"weight": "head.weight"}}))
    assert "layer 'head': tied param 'weight' points to 'head.weight', itself" in msg


def test_a_template_tie_to_itself_is_refused() -> None:
    msg = refused(model(BLOCK | {"tied": {"mlp.v": "model.layers.{i}.mlp.v"}}))
    assert "layer 'model.layers.0': tied param 'mlp.v' points to 'model.layers.0.mlp.v', itself" in msg


def test_a_chain_of_ties_is_refused_naming_the_owner() -> None:
    msg = refused(model(EMBED, {"name": "head", "tied": {"weight": "model.embed.weight"}},
                        {"name": "extra", "tied": {"weight": "head.weight"}}))
    assert ("layer 'extra': tied param 'weight' points to 'head.weight', which is itself tied "
            "(to 'model.embed.weight'); tie it to 'model.embed.weight'") in msg


def test_a_cycle_of_ties_is_refused() -> None:
    msg = refused(model(EMBED, {"name": "a", "tied": {"w": "b.w"}}, {"name": "b", "tied": {"w": "a.w"}}))
    assert "layer 'a': tied param 'w' points to 'b.w', which is itself tied (to 'a.w')" in msg
    assert "a chain of ties must end at a param" in msg


def test_a_tie_to_nothing_is_refused() -> None:
    msg = refused(model(EMBED, {"name": "head", "tied": {"weight": "model.embed.bias"}}))
    assert "layer 'head': tied param 'weight' points to 'model.embed.bias', which is not a param of any layer" in msg


def test_a_template_token_in_a_plain_layer_tie_is_no_param() -> None:
    msg = refused(model(BLOCK, {"name": "head", "tied": {"w": "model.layers.{i}.mlp.w"}}))
    assert "points to 'model.layers.{i}.mlp.w', which is not a param of any layer" in msg


def test_the_same_name_under_params_and_tied_is_the_tie() -> None:
    """A param the layer both lists and ties (as describe or a hand edit may write it): the tie wins."""
    spec = SpecFile.model_validate(model(EMBED, {"name": "head", "params": {"weight": [100, 8], "bias": [100]},
                                                 "tied": {"weight": "model.embed.weight"}}))
    head = spec.model.expanded()[1]
    assert [t.name for t in head.params] == ["bias"] and head.tied == {"weight": "model.embed.weight"}


@pytest.mark.parametrize(("entry", "said"), [
    ({"weight": [8, 100]}, "has shape [8, 100], but it is tied to 'model.embed.weight', whose shape is [100, 8]"),
    ({"weight": {"shape": [100, 8], "dtype": "float32"}},
     "has dtype float32, but it is tied to 'model.embed.weight', whose dtype is float16"),
])
def test_the_same_name_under_params_and_tied_must_have_the_target_shape(entry: dict, said: str) -> None:
    msg = refused(model(EMBED, {"name": "head", "params": entry, "tied": {"weight": "model.embed.weight"}}))
    assert f"layer 'head': param 'weight' {said}" in msg


def test_good_ties_are_kept_and_planned() -> None:
    """A tie across layers, a tie inside a template's own block, and a tie to a param of the same layer."""
    spec = SpecFile.model_validate(model(
        EMBED,
        BLOCK | {"tied": {"mlp.v": "model.layers.{i}.mlp.w"}},
        {"name": "head", "params": {"bias": [100]}, "tied": {"weight": "model.embed.weight", "b2": "head.bias"}},
    ))
    layers = {layer.name: layer for layer in spec.model.expanded()}
    assert layers["model.layers.1"].tied == {"mlp.v": "model.layers.1.mlp.w"}
    assert layers["head"].tied == {"weight": "model.embed.weight", "b2": "head.bias"}
    plan = planner.plan(spec, gpu_budget=10**6)
    assert plan.summary.total_bytes == (800 + 2 * 64 + 100) * 2  # tied names add no bytes


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 200), min_size=1, max_size=3), dtype=st.sampled_from(["float16", "float32"]),
       nested=st.booleans())
def test_a_listed_tie_is_accepted_exactly_when_it_matches_its_target(shape: list[int], dtype: str,
                                                                      nested: bool) -> None:
    """Whatever shape and dtype the listed param has: the tie wins when they are the target's, else a message
    naming both; listed in the tying layer itself or in a nested one."""
    param = {"weight": {"shape": shape, "dtype": dtype}}
    if nested:
        layers = (EMBED, {"name": "model", "tied": {"head.weight": "model.embed.weight"}},
                  {"name": "model.head", "params": param})
    else:
        layers = (EMBED, {"name": "head", "params": param, "tied": {"weight": "model.embed.weight"}})
    if shape == [100, 8] and dtype == "float16":
        spec = SpecFile.model_validate(model(*layers))
        assert sum(len(layer.params) for layer in spec.model.expanded()) == 1  # only the owner's
    else:
        assert "whose " in refused(model(*layers))
