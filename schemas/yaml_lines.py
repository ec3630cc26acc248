"""A YAML (and so JSON) loader that remembers the line of every node and rejects duplicate keys.

``load_with_lines(text)`` returns the plain data (dicts, lists, scalars, as
``yaml.safe_load`` would) and a ``{path: line}`` map, where a path is the tuple of
keys and list indexes leading to a node (``("model", "layers", 3, "repeat")``) and
the line is 1-based: for a mapping entry the line of its key, for a list item the
line where the item starts. Failures raise ``YamlProblem`` with a line and column.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

Path_ = tuple[Any, ...]

MAX_NODES = 2_000_000


@dataclass
class YamlProblem(Exception):
    """The text is not valid YAML for us: ``line``/``column`` are 1-based (or None)."""

    message: str
    line: int | None = None
    column: int | None = None
    path: Path_ = ()

    def __str__(self) -> str:
        return self.message


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


class _Builder:
    def __init__(self, loader: yaml.SafeLoader) -> None:
        self.loader = loader
        self.lines: dict[Path_, int] = {}
        self.open: set[int] = set()  # nodes being built: an alias back to one is a cycle
        self.count = 0

    def build(self, node: yaml.Node, path: Path_) -> Any:
        self.lines.setdefault(path, _line(node))
        self.count += 1
        if self.count > MAX_NODES:
            raise YamlProblem(f"document too large: more than {MAX_NODES} nodes (alias bomb?)")
        if id(node) in self.open:
            raise YamlProblem("an alias refers to a node that contains it (recursive structure)",
                              self.lines.get(path, _line(node)))
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            self.open.add(id(node))
            try:
                return self._collection(node, path)
            finally:
                self.open.discard(id(node))
        return self.loader.construct_object(node, deep=True)

    def _collection(self, node: yaml.Node, path: Path_) -> Any:
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        self._check_duplicates(node, path)
        self.loader.flatten_mapping(node)  # resolves `<<` merge keys; explicit keys come last and win
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.loader.construct_object(key_node, deep=True)
            self.lines[path + (key,)] = _line(key_node)
            out[key] = self.build(value_node, path + (key,))
        return out

    def _check_duplicates(self, node: yaml.MappingNode, path: Path_) -> None:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            where = (_line(key_node), key_node.start_mark.column + 1)
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlProblem("a mapping key must be a plain scalar, not a list or mapping", *where)
            key = self.loader.construct_object(key_node, deep=True)
            if key in first:
                raise YamlProblem(f"duplicate key (first defined on line {first[key]})", *where,
                                  path=path + (key,))
            first[key] = where[0]


def _problem_from_yaml(err: yaml.YAMLError, text: str) -> YamlProblem:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    if isinstance(err, yaml.reader.ReaderError):
        line = text.count("\n", 0, err.position) + 1
        return YamlProblem(f"not a text file: it holds the non-printable character #x{err.character:04x}",
                           line, err.position - (text.rfind("\n", 0, err.position) + 1) + 1)
    if mark is None:
        return YamlProblem(f"malformed YAML: {problem}")
    line, column = mark.line + 1, mark.column + 1
    lines = text.splitlines()
    src = lines[mark.line] if mark.line < len(lines) else ""
    if "\t" in src[: max(mark.column, 1) + 1] and "'\\t'" in problem:
        return YamlProblem("malformed YAML: a tab character; YAML indents with spaces only", line, column)
    context = getattr(err, "context", None)
    started = getattr(err, "context_mark", None)
    if context and started is not None and started.line != mark.line:
        context += f" started on line {started.line + 1}"
    detail = f"{context}: {problem.removeprefix('but ')}" if context else problem
    return YamlProblem(f"malformed YAML: {detail}", line, column)


def _json_fallback(text: str) -> tuple[Any, dict[Path_, int]] | None:
    """JSON that PyYAML refuses (tab indentation): parse it as JSON, without lines."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise YamlProblem(f"duplicate key '{key}'")
            out[key] = value
        return out

    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text, object_pairs_hook=no_duplicates), {}
    except json.JSONDecodeError:
        return None


def load_with_lines(text: str) -> tuple[Any, dict[Path_, int]]:
    """Parse one YAML/JSON document into plain data and a path -> line map."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None, {}
        builder = _Builder(loader)
        return builder.build(node, ()), builder.lines
    except yaml.YAMLError as err:
        fallback = _json_fallback(text)
        if fallback is not None:
            return fallback
        raise _problem_from_yaml(err, text) from None
    except RecursionError:
        raise YamlProblem("nested too deeply to read") from None
    finally:
        if loader is not None:
            loader.dispose()
