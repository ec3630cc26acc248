"""Names in a spec print as what they are (schemas/spec_names.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas.spec import SpecFile


def with_name(where: str, name: str) -> dict[str, Any]:
    layer: dict[str, Any] = {"name": "a", "params": {"w": [4]}}
    data: dict[str, Any] = {"model": {"name": "m", "dtype": "bf16", "layers": [layer]}}
    if where == "model":
        data["model"]["name"] = name
    elif where == "layer":
        layer["name"] = name
    elif where == "template":
        layer.update(name=f"{name}.{{i}}", repeat=2)
    elif where == "param":
        layer["params"] = {name: [4]}
    elif where == "tied":
        layer["tied"] = {name: "a.w"}
    elif where == "tie target":
        layer["tied"] = {"v": f"a.{name}"}
    elif where == "offload segment":
        data["offload"] = {"params": [name]}
    return data


WHERE = ["model", "layer", "template", "param", "tied", "tie target", "offload segment"]
BAD = {
    "escape sequence": ("w\x1b[31m", "U+001B"),
    "bidi override": ("w\u202egnp.exe", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    "bidi isolate": ("w\u2066", "U+2066"),
    "zero-width space": ("w\u200bx", "U+200B (ZERO WIDTH SPACE)"),
    "zero-width joiner": ("w\u200dx", "U+200D"),
    "byte order mark": ("\ufeffw", "U+FEFF"),
    "tab": ("w\tx", "U+0009"),
    "newline": ("w\nx", "U+000A"),
    "nul": ("w\x00", "U+0000"),
    "delete": ("w\x7f", "U+007F"),
    "c1 control": ("w\x9b", "U+009B"),
    "no-break space": ("w\u00a0x", "U+00A0"),
    "line separator": ("w\u2028x", "U+2028"),
    "private use": ("w\ue000", "U+E000"),
    "unassigned": ("w\U000e0fff", "U+E0FFF"),
}


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("kind", sorted(BAD))
def test_invisible_and_control_characters_are_refused(where: str, kind: str) -> None:
    name, fragment = BAD[kind]
    with pytest.raises(ValidationError) as info:
        SpecFile.model_validate(with_name(where, name))
    messages = [e["msg"] for e in info.value.errors(include_url=False)]
    assert any(fragment in m and "must be printable" in m for m in messages), messages
    assert not any(name in m for m in messages), "the raw name was printed"


@pytest.mark.parametrize("where", WHERE)
def test_names_not_in_nfc_are_refused(where: str) -> None:
    with pytest.raises(ValidationError) as info:
        SpecFile.model_validate(with_name(where, "cafe\u0301"))
    text = str(info.value)
    assert "is not in Unicode normal form NFC; write it as" in text and "caf\\xe9" in text


@pytest.mark.parametrize("where", [w for w in WHERE if w != "offload segment"])
def test_printable_unicode_and_spaces_inside_are_fine(where: str) -> None:
    name = "caf\u00e9 \u6a21\u578b"  # NFC, printable, an inner ASCII space
    data = with_name(where, name)
    if where == "tie target":
        data["model"]["layers"][0]["params"][name] = [4]
    SpecFile.model_validate(data)
