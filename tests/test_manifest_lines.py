"""The manifest's line grammar (planner/review/manifest_lines.py): whatever check-plans accepts, sh reads as the same
commands with the same words; what sh would read otherwise is refused with its line."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.review.manifest_lines import command_lines

# pieces a line is made of: plain words, separators, quotes, continuations and what sh reads its own way
PIECES = ["a", "b.yaml", "-o", "--x", " ", " ", "\t", "'", '"', "\\", "\\\n", "\\ \n", "#", " #", "\n", "\r",
          "\r\n", "\ufeff", "$", "é", "\u00a0", "\x0b", "\x0c", "\u2028", "\x85", "=", "''"]

SH = shutil.which("sh")
needs_sh = pytest.mark.skipif(SH is None, reason="needs sh")


def _sh_commands(text: str) -> list[list[str]]:
    """The commands sh runs for ``text`` (each one `planner ARGS`), as their words."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "planner-plans.sh"
        script.write_bytes(text.encode())
        shell = "planner() { printf 'planner\\037'; printf '%s\\037' \"$@\"; printf '\\036'; }; . ./planner-plans.sh"
        out = subprocess.run([SH, "-c", shell], cwd=tmp, capture_output=True, check=False).stdout.decode()
    return [cmd.split("\x1f")[:-1] for cmd in out.split("\x1e")[:-1]]


@needs_sh
@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from(PIECES), max_size=8), min_size=1, max_size=3))
def test_what_is_accepted_sh_reads_alike(lines: list[list[str]]) -> None:
    text = "".join("planner plan " + "".join(pieces) + "\n" for pieces in lines)
    commands, problems = command_lines(text)
    if problems or any(words[0] != "planner" for _, words in commands):
        return  # refused (check-plans refuses a command other than `planner plan` as well)
    assert [words for _, words in commands] == _sh_commands(text), repr(text)


@pytest.mark.parametrize(("text", "line", "fragment"), [
    ("planner plan s.yaml -o p.yaml\r\n", 1, "a carriage return (CRLF line ends?)"),
    ("# plans\r\nplanner plan s.yaml -o p.yaml\r\n", 1, "a carriage return"),
    ("\ufeffplanner plan s.yaml -o p.yaml\n", 1, "a byte-order mark"),
    ("planner plan s.yaml \\ \n  -o p.yaml\n", 1, "'\\' and then spaces end the line"),
    ("planner plan 's.yaml\\\n' -o p.yaml\n", 1, "a backslash ends the line inside quotes"),
    ("planner plan s.yaml -o p\\.yaml\n", 1, "'\\': a line is one plan command"),
    ("planner plan s.yaml -o p.yaml \\\\\n", 1, "'\\': a line is one plan command"),  # an escaped backslash
    ("planner plan s.yaml\n\nplanner plan s.yaml -o p.yaml\x0c\n", 3, "a control character (U+000C)"),
])
def test_what_sh_reads_otherwise_is_refused_with_its_line(text: str, line: int, fragment: str) -> None:
    _, problems = command_lines(text)
    assert problems and problems[0][0] == line and fragment in problems[0][1], problems


def test_a_continuation_joins_as_sh_does() -> None:
    commands, problems = command_lines("planner plan s.yaml --gpu-budget 12\\\nGB \\\n  -o p.yaml # c \\\n")
    assert not problems
    assert commands == [(1, ["planner", "plan", "s.yaml", "--gpu-budget", "12GB", "-o", "p.yaml"])]
