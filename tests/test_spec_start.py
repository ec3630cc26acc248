"""``start:`` lets a ``{i}`` template begin past 0 (DeepSeek's dense first layer, then MoE layers)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import SpecFile


def spec(layers):
    return {"model": {"name": "m", "dtype": "bfloat16", "layers": layers}}


def test_start_offsets_the_expanded_names():
    s = SpecFile.model_validate(spec([
        {"name": "model.layers.0", "params": {"mlp.w": [4, 4]}},
        {"name": "model.layers.{i}", "repeat": 3, "start": 1, "params": {"mlp.experts.w": [2, 4, 4]},
         "tied": {"alias": "model.layers.{i}.mlp.experts.w"}},
    ]))
    layers = s.model.expanded()
    assert [layer.name for layer in layers] == ["model.layers.0", "model.layers.1", "model.layers.2", "model.layers.3"]
    assert layers[3].tied == {"alias": "model.layers.3.mlp.experts.w"}


def test_start_collision_is_a_duplicate():
    with pytest.raises(ValidationError, match="duplicate layer name 'model.layers.1'"):
        SpecFile.model_validate(spec([
            {"name": "model.layers.1", "params": {"w": [4]}},
            {"name": "model.layers.{i}", "repeat": 2, "start": 1, "params": {"w": [4]}},
        ]))


def test_start_needs_repeat():
    with pytest.raises(ValidationError, match="start but no repeat"):
        SpecFile.model_validate(spec([{"name": "x", "start": 2, "params": {"w": [4]}}]))


def test_block_stack_found_with_start():
    import planner

    s = SpecFile.model_validate(spec([
        {"name": "embed", "params": {"w": [8, 4]}},
        {"name": "model.layers.0", "params": {"w": [4, 4]}},
        {"name": "model.layers.{i}", "repeat": 7, "start": 1, "params": {"w": [4, 4]}},
    ]))
    plan = planner.plan(s, strategy="group", group_size=2, num_in_group=1, prefetch_step=1)
    assert [layer.name for layer in plan.layers if layer.offloaded] == [f"model.layers.{i}" for i in (1, 3, 5, 7)]
