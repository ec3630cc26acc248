"""The line grammar of the plans manifest (``planner-plans.sh``), which ``sh`` and check-plans must read alike.

A manifest is UTF-8 text, lines ended by LF. Each line is blank, a comment (``#`` first), or one command of
plain words separated by spaces or tabs, with single or double quotes, and optionally a trailing comment
(``#`` after a space). A line whose very last character is a backslash (outside quotes, not in a comment)
continues on the next one: like sh, the backslash and the line break are dropped, nothing put in their place.

Everything else that sh would read otherwise is refused with its line, never reinterpreted:
- a carriage return (CRLF line ends: sh keeps it in the line's last word, so ``-o plan.yaml`` writes
  ``plan.yaml\\r``), a byte-order mark (sh reads it as part of the first word), any other control character;
- a backslash anywhere but at the very end of a line (``\\ `` with a space after it is an escaped space to sh,
  not a continuation), or at the end of a line inside quotes (sh keeps it and the line break in the word);
- what sh expands or interprets: variables, command substitution, globs, ``~``, pipes, redirections,
  ``;``, ``&``, parentheses, braces, ``!``, and ``#`` inside a word.
"""

from __future__ import annotations

import re
import shlex

SHELL_CHARS = re.compile(r"[$`\\;&|<>()*?\[\]{}~!]")  # a meaning to sh that this reader does not share
MID_WORD_HASH = re.compile(r"\S#")  # sh keeps it in the word, a comment reader would not
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f\ufeff]")  # tab and the LF between lines are the only ones
CONTROL_NAMES = {"\r": "a carriage return (CRLF line ends?): sh keeps it in the line's last word (-o plan.yaml "
                       "would write 'plan.yaml\\r'); save the file with LF line ends",
                 "\ufeff": "a byte-order mark (U+FEFF): sh reads it as part of the word it touches (the first "
                           "word is then no command); save the file as UTF-8 without a BOM"}
PLAIN = ("a line is one plan command of plain words (quotes allowed), read alike by sh and check-plans: no "
         "variables, globs, ~, pipes, redirections, ;, & or # inside a word")


def command_lines(text: str) -> tuple[list[tuple[int, list[str]]], list[tuple[int, str]]]:
    """The words of each command of ``text`` with the line it starts on, and every (line, problem) found."""
    commands: list[tuple[int, list[str]]] = []
    problems: list[tuple[int, str]] = []
    start, joined = 0, ""
    for number, line in enumerate(text.split("\n"), start=1):
        bad = CONTROL.search(line)
        if bad:
            problems.append((number, _control(bad.group())))
            joined = ""
            continue
        if not joined:
            start = number
        code, comment = _split_comment(joined + line)
        try:
            if comment is None and line.endswith("\\") and not line.endswith("\\\\"):  # "\\" is an escaped "\"
                if _open_quote(code[:-1]):
                    raise ValueError("a backslash ends the line inside quotes: sh keeps it and the line break "
                                     "in the word; close the quotes before the backslash")
                joined = code[:-1]
                continue
            joined = ""
            words = _words(code)
            if words:
                commands.append((start, words))
        except ValueError as err:
            joined = ""
            problems.append((number, str(err)))
    if joined:  # a continuation on the last line: sh runs what there is
        try:
            words = _words(joined)
            if words:
                commands.append((start, words))
        except ValueError as err:
            problems.append((start, str(err)))
    return commands, problems


def _control(char: str) -> str:
    return CONTROL_NAMES.get(char, f"a control character (U+{ord(char):04X}): sh and check-plans would read the "
                                   "line apart; remove it")


def _split_comment(line: str) -> tuple[str, str | None]:
    """``line`` without its comment, and the comment (None: there is none): a ``#`` outside quotes that
    starts the line or follows a space or tab."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i], line[i:]
    return line, None


def _open_quote(code: str) -> bool:
    quote = None
    for char in code:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
    return quote is not None


def _words(code: str) -> list[str]:
    """The words of one line (no comment, no continuation) as sh splits them, or ValueError."""
    if not code.strip():
        return []
    stripped = code.rstrip(" \t")
    if stripped.endswith("\\") and stripped != code:
        raise ValueError("'\\' and then spaces end the line: sh continues a line only when the backslash is its "
                         "very last character (with a space after it, it is an escaped space); remove the spaces")
    bad = SHELL_CHARS.search(code) or MID_WORD_HASH.search(code)
    if bad:
        raise ValueError(f"'{bad.group()[-1]}': {PLAIN}")
    lexer = shlex.shlex(code, posix=True)
    lexer.whitespace_split = True
    lexer.whitespace = " \t"
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError as err:  # no closing quotation
        raise ValueError(f"{err}: {code.strip()}") from None
