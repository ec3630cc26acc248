"""The one size parser (schemas/sizes.py): what it accepts, exactly, and that nothing else parses."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.sizes import MAX_BYTES, parse_size

# written out here, not imported, so the test checks the parser's table
UNIT_BYTES = {
    "": 1, "B": 1,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4, "PB": 1000**5, "EB": 1000**6,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4, "PiB": 1024**5, "EiB": 1024**6,
}
# the documented grammar, spelled independently of the parser's
GRAMMAR = re.compile(r"[ \t\r\n]*(?:[0-9]+|[0-9]+\.[0-9]+|\.[0-9]+)(?: ?(?:[bB]|[kKmMgGtTpPeE][iI]?[bB]))?[ \t\r\n]*")


def _case(unit: str, draw_case: list[bool]) -> str:
    return "".join(c.upper() if up else c.lower() for c, up in zip(unit, draw_case))


@st.composite
def size_texts(draw: st.DrawFn) -> tuple[str, Fraction, int]:
    """A size as a person might write it: (text, exact bytes, unit multiplier)."""
    whole = draw(st.integers(min_value=0, max_value=10**13))
    frac = draw(st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=6)))
    unit = draw(st.sampled_from(sorted(UNIT_BYTES)))
    spelled = _case(unit, draw(st.lists(st.booleans(), min_size=len(unit), max_size=len(unit))))
    space = draw(st.sampled_from(["", " "])) if unit else ""
    number = f"{whole}.{frac}" if frac else str(whole)
    if frac and whole == 0 and draw(st.booleans()):
        number = f".{frac}"
    pad = draw(st.sampled_from(["", " ", "  ", "\t"]))
    exact = (whole + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)) * UNIT_BYTES[unit]
    return f"{pad}{number}{space}{spelled}{pad}", exact, UNIT_BYTES[unit]


@given(size_texts())
def test_a_written_size_parses_to_its_bytes(case: tuple[str, Fraction, int]) -> None:
    text, exact, mult = case
    valid = 1 <= exact and int(exact) <= MAX_BYTES and (mult > 1 or exact.denominator == 1)
    if valid:
        assert parse_size(text) == int(exact)  # a fraction of a byte is dropped
    else:
        with pytest.raises(ValidationError):
            parse_size(text)


@given(st.integers(min_value=1, max_value=MAX_BYTES))
def test_bytes_round_trip_as_int_and_as_text(n: int) -> None:
    assert parse_size(n) == n
    assert parse_size(str(n)) == n


@given(st.integers(min_value=1, max_value=MAX_BYTES), st.sampled_from(["KB", "GiB", "TB", "MiB", "EiB"]))
def test_whole_units_round_trip(n: int, unit: str) -> None:
    assume(n * UNIT_BYTES[unit] <= MAX_BYTES)
    assert parse_size(f"{n}{unit}") == n * UNIT_BYTES[unit]


@given(size_texts(), st.text(min_size=1, max_size=8))
def test_trailing_junk_never_parses(case: tuple[str, Fraction, int], junk: str) -> None:
    text = case[0].rstrip() + junk
    assume(not GRAMMAR.fullmatch(text))  # junk such as "B" or " " may complete a valid size
    with pytest.raises(ValidationError):
        parse_size(text)


@given(st.text(max_size=24))
def test_random_text_parses_only_if_it_is_a_size(text: str) -> None:
    try:
        n = parse_size(text)
    except ValidationError:
        return
    assert GRAMMAR.fullmatch(text), text
    assert 1 <= n <= MAX_BYTES


@given(st.one_of(st.booleans(), st.floats(), st.none(), st.lists(st.integers()), st.binary(max_size=4)))
def test_other_types_are_refused(value: object) -> None:
    with pytest.raises(ValidationError):
        parse_size(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value, fragment", [
    ("12GB;rm", "nothing may follow the unit"),
    ("12 GB extra", "nothing may follow the unit"),
    ("1,5GB", "decimal point is '.'"),
    ("1_000", "decimal point is '.'"),
    ("1.5.5GB", "more than one decimal point"),
    ("12e-9GB", "no exponents"),
    ("1e-3", "no exponents"),
    (True, "a true/false value"),
    (False, "a true/false value"),
    (1.5e10, "a float, not a size"),
    (float("nan"), "a float"),
    (float("inf"), "a float"),
    ("nan", "(got 'nan')"),
    ("inf", "(got 'inf')"),
    (-5, "must be > 0 (got -5)"),
    ("-5GB", "must be > 0"),
    (0, "must be > 0"),
    ("0", "must be > 0"),
    ("0.0001KB", "less than 1 byte"),
    ("1.5", "must be whole"),
    ("1.5B", "must be whole"),
    (2**63, "at most 2^63-1"),
    ("9223372036854775808", "at most 2^63-1"),
    ("10EiB", "at most 2^63-1"),
    pytest.param(10**5000, "a 16610-bit number", id="int-of-5000-digits"),
    ("9" * 5000, "too long to be a size"),
    ("12 GX", "unknown size unit 'GX'"),
    ("12 GX", "(did you mean 'GB'?)"),
    ("\u0661\u0662GB", "(got '\u0661\u0662GB')"),  # Arabic-Indic digits are not digits here
    ("12\u00a0GB", "(got '12\\xa0GB')"),
    ("12  GB", "(got '12  GB')"),
    ("1\x1f", "(got '1\\x1f')"),  # str.strip() would take it for a space
    ("\u20031GB", "(got '\\u20031GB')"),
    ("+5GB", "(got '+5GB')"),
    ("0x10", "(got '0x10')"),
    ("", "(got '')"),
    ("12GB\x1b[2J", "'12GB\\x1b[2J'"),  # shown escaped, never raw
])
def test_bad_sizes_are_refused_with_a_reason(value: object, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_size(value)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert "\x1b" not in str(info.value)


@pytest.mark.parametrize("text, expected", [
    ("20GB", 20 * 10**9), ("20 GiB", 20 * 2**30), ("1.5TB", 15 * 10**11), (".5KB", 500),
    ("20gb", 20 * 10**9), ("7", 7), (" 12MiB\n", 12 * 2**20), ("1.3GiB", 1395864371),
    ("7EiB", 7 * 2**60), (str(MAX_BYTES), MAX_BYTES),
])
def test_good_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_plan_api_refuses_a_bad_budget_with_a_clear_message(llama8b: object) -> None:
    import planner

    for value, fragment in ((-5, "must be > 0 (got -5)"), (True, "true/false"), ("12GB;rm", "nothing may follow")):
        with pytest.raises(ValidationError) as info:
            planner.plan(llama8b, gpu_budget=value)  # type: ignore[arg-type]
        text = str(info.value)
        assert "gpu_budget" in text and fragment in text
