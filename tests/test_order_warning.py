"""The runtime's warning when offloaded layers run out of the plan's order names what happened at the first
difference, never "(end of forward) ran where the plan expects (end of forward)" (runtime/prefetch.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from runtime.prefetch import PrefetchOffloader

LAYERS = [SimpleNamespace(name=f"model.layers.{i}") for i in range(3)]


@pytest.mark.parametrize(("seen", "said"), [
    ([0, 2, 1], "step 1: model.layers.2 ran where the plan expects model.layers.1"),
    ([0, 1], "step 2: the forward ended before model.layers.2 ran"),
    ([0, 1, 2, 2], "step 3: model.layers.2 ran again after the plan's last offloaded layer"),
    ([0, 1, 2, 0, 1, 2], "step 3: model.layers.0 ran again after the plan's last offloaded layer"),
])
def test_the_first_difference_is_named(seen: list[int], said: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="runtime"):
        PrefetchOffloader._check_order(SimpleNamespace(layers=LAYERS), seen)  # type: ignore[arg-type]
    assert said in caplog.text and "(end of forward)" not in caplog.text


def test_the_plan_order_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="runtime"):
        PrefetchOffloader._check_order(SimpleNamespace(layers=LAYERS), [0, 1, 2])  # type: ignore[arg-type]
    assert caplog.text == ""
