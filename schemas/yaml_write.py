"""Writing plain data (dicts, lists, str, int, float, bool, None) as compact, readable YAML.

``dump_yaml(data)`` lays out mappings and lists in block style, one entry a line,
except that a collection nested at least ``FLOW_DEPTH`` levels deep that holds only
scalars and lists of scalars is written on one line in flow style when that line fits
in ``width`` columns (a param: ``q.weight: {shape: [4096, 4096], dtype: bfloat16, bytes: 33554432}``).
Strings are plain when that reads back as the same string, else quoted by PyYAML
(double quotes inside flow collections, for keys and for anything but printable ASCII). The output is a pure function of the data (byte-identical across runs and
whether or not PyYAML has libyaml) and ``yaml.safe_load`` reads it back to equal data.

Why not ``yaml.dump``: for a plan of 20,000 params PyYAML's representer and emitter take
seconds (libyaml's emitter still over 1 s); this takes a few hundredths. A collection object that the data
holds more than once (``schemas.io.plan_data`` gives a plan's repeated params one dict, and layers listing the same
params one ``params`` mapping) is laid out once.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

FLOW_DEPTH = 3
WIDTH = 120

# Strings that are safe as plain scalars in block and flow context alike, unless the
# resolver reads them as something else (true, null, no, ...): checked with PyYAML's resolver.
_SAFE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_ASCII = re.compile(r"[ -~]*")
_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()


def _plain_ok(text: str) -> bool:
    return (_SAFE.fullmatch(text) is not None
            and _RESOLVER.resolve(yaml.ScalarNode, text, (True, False)) == _STR_TAG)


def _pyyaml_scalar(value: Any, style: str | None) -> str:
    """One scalar as PyYAML writes it, on one line (``style='"'``: double-quoted)."""
    text = yaml.dump(value, Dumper=yaml.SafeDumper, default_style=style, allow_unicode=True,
                     width=float("inf"), explicit_end=False)
    text = text.removesuffix("\n...\n").removesuffix("\n")
    if "\n" in text and style is None:  # a multi-line quoted string: escape the breaks instead
        return _pyyaml_scalar(value, '"')
    return text


class _Writer:
    def __init__(self, width: int) -> None:
        self.width = width
        self.strings: dict[tuple[str, bool], str] = {}
        self.flows: dict[int, str | None] = {}  # id(collection) -> its flow text: an object met again is not re-read
        # (id(collection), indent) -> where its lines are in the output: a mapping's value met again at the same
        # indent is copied, not laid out again (the lines of a value depend only on it and its indent)
        self.spans: dict[tuple[int, int], tuple[int, int]] = {}

    def scalar(self, value: Any, flow: bool) -> str:
        """``flow``: the scalar sits inside a flow collection or is a key."""
        if value is None:
            return "null"
        if value is True:
            return "true"
        if value is False:
            return "false"
        kind = type(value)
        if kind is int:
            return str(value)
        if kind is str:
            key = (value, flow)
            out = self.strings.get(key)
            if out is None:
                if _plain_ok(value):
                    out = value
                else:  # PyYAML's choice only for printable ASCII (it folds a raw NEL, U+0085)
                    out = _pyyaml_scalar(value, None if not flow and _ASCII.fullmatch(value) else '"')
                self.strings[key] = out
            return out
        if kind is float:
            return _pyyaml_scalar(value, None)
        raise TypeError(f"cannot write a {kind.__name__} as YAML: {value!r:.60}")

    def flow(self, value: Any, depth: int) -> str | None:
        """``value`` as one flow-style string, or None when it nests deeper than two levels."""
        kind = type(value)
        if kind is not dict and kind is not list:
            return self.scalar(value, True)
        if depth > 1:
            return None
        strings = self.strings
        parts = []
        for item in (value.items() if kind is dict else value):
            v = item[1] if kind is dict else item
            t = type(v)
            if t is int:
                text: str | None = str(v)
            elif t is str:
                text = strings.get((v, True)) or self.scalar(v, True)
            else:
                text = self.flow(v, depth + 1)
                if text is None:
                    return None
            if kind is dict:
                k = item[0]
                text = f"{strings.get((k, True)) or self.scalar(k, True)}: {text}"
            parts.append(text)
        return ("{" if kind is dict else "[") + ", ".join(parts) + ("}" if kind is dict else "]")

    def inline(self, value: Any, depth: int, used: int) -> str | None:
        """``value`` written after ``used`` columns on the same line, or None: it needs block style."""
        if not isinstance(value, (dict, list)):
            return self.scalar(value, False)
        if not value:
            return "{}" if isinstance(value, dict) else "[]"
        if depth < FLOW_DEPTH:
            return None
        try:
            text = self.flows[id(value)]
        except KeyError:
            text = self.flows[id(value)] = self.flow(value, 0)
        if text is None or used + len(text) > self.width:
            return None
        return text

    def block(self, value: dict[Any, Any] | list[Any], indent: int, depth: int, out: list[str]) -> None:
        """Lines of a non-empty collection in block style at ``indent`` spaces (``depth`` levels deep)."""
        pad = " " * indent
        if isinstance(value, dict):
            for k, v in value.items():
                head = f"{pad}{self.scalar(k, True)}:"
                text = self.inline(v, depth + 1, len(head) + 1)
                if text is not None:
                    out.append(f"{head} {text}")
                    continue
                out.append(head)
                span = self.spans.get((id(v), indent))
                if span is not None:
                    out.extend(out[span[0]:span[1]])
                    continue
                start = len(out)
                self.block(v, indent + 2, depth + 1, out)
                self.spans[id(v), indent] = start, len(out)
            return
        for v in value:
            text = self.inline(v, depth + 1, indent + 2)
            if text is not None:
                out.append(f"{pad}- {text}")
                continue
            start = len(out)
            self.block(v, indent + 2, depth + 1, out)
            out[start] = f"{pad}- {out[start][indent + 2:]}"


def dump_yaml(data: Any, width: int = WIDTH) -> str:
    """``data`` as YAML text (see the module docstring for the layout)."""
    writer = _Writer(width)
    if isinstance(data, (dict, list)) and data:
        out: list[str] = []
        writer.block(data, 0, 0, out)
        return "\n".join(out) + "\n"
    text = writer.inline(data, 0, 0)
    assert text is not None
    return text + "\n"
