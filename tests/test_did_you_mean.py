"""One "did you mean" (schemas/errors.py ``suggest``): every unknown name the project reports, from spec keys to
size units, dtypes and transformers' config names, gets its hint from it, in one form."""

from __future__ import annotations

import pytest

from schemas.dtypes import canonical_dtype
from schemas.errors import suggest
from schemas.sizes import parse_size


def test_one_form_closest_first_and_nothing_when_nothing_is_close() -> None:
    assert suggest("offlaod", ["model", "offload", "memory"]) == " (did you mean 'offload'?)"
    assert suggest("zzzz", ["model", "offload"]) == ""
    assert suggest("H200", ["h100", "h200"]) == " (did you mean 'h200'?)"
    assert suggest("RELU", ["relu", "gelu"], n=3) == " (did you mean 'relu'?)"  # only a case away
    several = suggest("gelu_x", ["gelu", "relu", "silu"], n=2)
    assert several.startswith(" (did you mean one of 'gelu', ") and several.count("'") == 4


def test_sizes_and_dtypes_hint_the_same_way() -> None:
    with pytest.raises(ValueError, match=r"unknown size unit 'GiG' in '12 GiG' \(did you mean 'GiB'\?\)"):
        parse_size("12 GiG")
    with pytest.raises(ValueError, match=r"unknown dtype 'bfloat61' \(did you mean 'bfloat16'\?\)"):
        canonical_dtype("bfloat61")
