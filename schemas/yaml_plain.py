"""A fast reader for plain block YAML, the shape specs and plans are written in; None for anything else.

``read_plain(text)`` gives the same data as ``yaml.safe_load(text)`` for a document made only of:
block mappings and block sequences (one entry a line, indented with spaces, a sequence also at the
indentation of its key), keys that are plain words (``attn.q_proj.weight``), values that are plain
scalars without spaces, ``:`` or ``#`` (``4096``, ``bfloat16``, ``model.layers.{i}``, ``10GiB``, ``true``),
and one-line flow collections of such scalars (``[4096, 4096]``, ``{weight: [32000, 1024]}``), with
blank lines and comments anywhere. It returns None (``schemas.yaml_lines`` then reads the text with
PyYAML's parser) for everything else: quotes, anchors, tags, multi-line scalars, nested flow
collections, tabs, a duplicate key, a character other than printable ASCII outside comments, more than ``MAX_NODES``
nodes or ``MAX_DEPTH`` levels, and any text that is not valid YAML; so the messages for bad input
stay PyYAML's.

Why: a 1,000-layer spec has 22,000 lines and 75,000 parser events; libyaml's parser hands each event
to Python as an object with two position marks, and building the data from them was 0.1-0.2 s of
every `planner plan`. Here one regular expression reads each line, and each distinct scalar or flow
text is resolved once, by PyYAML's own resolver and constructor, so a value is exactly what PyYAML
makes of it (``on`` is True, ``0o17`` is 15, ``2026-12-02`` is a date).
"""

from __future__ import annotations

import re
from typing import Any

from schemas.yaml_lines import MAX_DEPTH, MAX_NODES, YamlProblem, construct_plain

# a plain scalar: no spaces, ':', '#', quotes, or indicators that start something else (- ? ! & * | > % @ `)
_WORD = r"(?:[A-Za-z0-9_]|[-+.][A-Za-z0-9_])[A-Za-z0-9_.+\-/]*"
_BLOCK_WORD = r"(?:[A-Za-z0-9_]|[-+.][A-Za-z0-9_])[A-Za-z0-9_.+\-/{}]*"  # a flow indicator inside is text
_KEY = r"[A-Za-z_][A-Za-z0-9_.\-/]*"
_SEQ = rf"\[ *(?:{_WORD}(?: *, *{_WORD})*)? *\]"
_MAP = rf"\{{ *(?:{_KEY}: +(?:{_WORD}|{_SEQ})(?: *, *{_KEY}: +(?:{_WORD}|{_SEQ}))*)? *\}}"
# a line: indent, '-', key, value (possessive: each part, once matched, is kept), a comment after a space
_LINE = re.compile(rf"( *+)(?:(-)(?: ++|$))?+(?:({_KEY}):(?: ++|$))?+({_BLOCK_WORD}|{_SEQ}|{_MAP})?+ *+(?:(?<= )#.*)?$")
_SKIP = re.compile(r" *(?:#.*)?")  # a blank or comment line
# what PyYAML refuses (a non-printable character) or reads as a break or indentation (tabs, CR, NEL, U+2028/9), and
# a byte order mark; other characters outside ASCII are read only in comments (a line with one elsewhere is declined)
_ODD = re.compile("[^\n -~\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]|[\u2028\u2029\ufeff]")
MAX_LINE = 1000  # a longer line could hold a key past the 1,024 characters PyYAML looks ahead for its ':'
_SEQ_ITEMS = re.compile(_WORD)
_MAP_ITEMS = re.compile(rf"({_KEY}): +({_WORD}|{_SEQ})")


class _Decline(Exception):
    """The text is not of the plain shape (or not valid YAML): PyYAML's parser reads it."""


class _Reader:
    """Each distinct scalar or flow text read once: ``known[text]`` is (nodes, kind, what), kind 0 a scalar (the
    value, immutable, shared), 1 a flow sequence (its items), 2 a flow mapping (its (key, value) pairs, a nested
    sequence as a tuple); a collection is made anew at each use (``_make``), so no data is shared."""

    def __init__(self) -> None:
        self.known: dict[str, tuple[int, int, Any]] = {}

    def scalar(self, text: str) -> Any:
        known = self.known.get(text)
        if known is None:
            known = self.learn(text)
        return known[2]

    def learn(self, text: str) -> tuple[int, int, Any]:
        first = text[0]
        if first == "[":
            items = tuple(self.scalar(w) for w in _SEQ_ITEMS.findall(text))
            out: tuple[int, int, Any] = (1 + len(items), 1, items)
        elif first == "{":
            pairs: list[tuple[Any, Any]] = []
            seen: set[Any] = set()
            nodes = 1
            for key_text, value_text in _MAP_ITEMS.findall(text):
                key = self.scalar(key_text)
                if key in seen:
                    raise _Decline  # a duplicate key: PyYAML's path names both lines
                seen.add(key)
                value_nodes, _, value = self.known.get(value_text) or self.learn(value_text)
                pairs.append((key, value))
                nodes += 1 + value_nodes
            out = (nodes, 2, tuple(pairs))
        else:
            try:
                out = (1, 0, construct_plain(text))
            except YamlProblem:  # a number too large, an impossible date: PyYAML's path says so
                raise _Decline from None
        self.known[text] = out
        return out


def _make(kind: int, what: Any) -> Any:
    """A value from what ``_Reader.learn`` keeps (kind 1 or 2: a new list or dict)."""
    if kind == 1:
        return list(what)
    return {k: (list(v) if type(v) is tuple else v) for k, v in what}


def read_plain(text: str) -> Any:
    """The data of ``text`` when it is plain block YAML (see the module docstring), else None."""
    if _ODD.search(text) is not None:
        return None
    try:
        return _read(text)
    except (_Decline, TypeError):  # TypeError: an unhashable key (cannot happen here; PyYAML's path says so)
        return None


def _read(text: str) -> Any:
    reader = _Reader()
    known, learn = reader.known, reader.learn
    match, skip = _LINE.match, _SKIP.fullmatch
    root: Any = None
    # the innermost open collection: its indent, itself, whether it is a sequence and whether a sequence
    # at its key's indent; ``outer`` holds the same of each collection around it
    top: Any = None
    top_indent, top_seq, top_at_key = -1, False, False
    outer: list[tuple[int, Any, bool, bool]] = []
    pending: Any = None  # (collection, key or index, indent of the owner, owner is a mapping key): a value to come
    nodes = 0  # at least as many as PyYAML's parser meets (keys included)
    lines = text.split("\n")
    if max(map(len, lines)) > MAX_LINE:
        raise _Decline
    for line in lines:
        m = match(line)
        if m is None:
            if skip(line) is not None:
                continue
            raise _Decline
        spaces, dash, key, value = m.groups()
        indent = len(spaces)
        if dash is None and key is None:
            if value is None:
                continue  # blank or comment
            raise _Decline  # a bare scalar: a document of one scalar, or a multi-line scalar
        if dash is not None or pending is not None or indent != top_indent or top_seq:
            # not the common line (key: value in the open mapping): open or close collections first
            if pending is not None:
                owner, slot, owner_indent, from_key = pending
                pending = None
                if indent > owner_indent or (indent == owner_indent and from_key and dash is not None):
                    new: Any = [] if dash is not None else {}
                    owner[slot] = new
                    if len(outer) >= MAX_DEPTH:
                        raise _Decline
                    outer.append((top_indent, top, top_seq, top_at_key))
                    top, top_indent, top_seq, top_at_key = new, indent, dash is not None, indent == owner_indent
            if root is None:
                root = top = [] if dash is not None else {}
                top_indent, top_seq = indent, dash is not None
            # close what this line is not inside of
            while top_indent > indent or (top_indent == indent and top_at_key and dash is None):
                if not outer:
                    raise _Decline
                top_indent, top, top_seq, top_at_key = outer.pop()
            if top_indent != indent or top_seq != (dash is not None):
                raise _Decline
            if dash is not None:
                if key is None:
                    if value is None:
                        pending = (top, len(top), indent, False)
                        top.append(None)
                        nodes += 1
                    else:
                        n, kind, what = known.get(value) or learn(value)
                        top.append(what if kind == 0 else _make(kind, what))
                        nodes += n
                    continue
                item: dict[Any, Any] = {}
                top.append(item)
                if len(outer) >= MAX_DEPTH:
                    raise _Decline
                outer.append((top_indent, top, top_seq, top_at_key))
                indent = m.start(3)  # the mapping's keys line up with its first
                top, top_indent, top_seq, top_at_key = item, indent, False, False
                nodes += 1
        name = (known.get(key) or learn(key))[2]
        if name in top:
            raise _Decline  # a duplicate key: PyYAML's path names both lines
        if value is None:
            top[name] = None
            pending = (top, name, indent, True)
            nodes += 2
        else:
            n, kind, what = known.get(value) or learn(value)
            top[name] = what if kind == 0 else _make(kind, what)
            nodes += 1 + n
        if nodes > MAX_NODES:
            raise _Decline
    if root is None or nodes > MAX_NODES:
        raise _Decline
    return root
