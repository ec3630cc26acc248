"""A YAML (and so JSON) loader that remembers the line of every node and rejects duplicate keys.

``load_data(text)`` returns the plain data (dicts, lists, scalars, as ``yaml.safe_load``
would); ``load_with_lines(text)`` returns the same data and a ``{path: line}`` map,
where a path is the tuple of keys and list indexes leading to a node
(``("model", "layers", 3, "repeat")``) and the line is 1-based: for a mapping entry
the line of its key, for a list item the line where the item starts. Failures raise
``YamlProblem`` with a line and column.

Speed: both build the data from the parser's event stream (libyaml's parser when
PyYAML has it, else PyYAML's pure-Python one; the data is the same), iteratively, with
each distinct scalar resolved and constructed once. Documents with anchors, aliases,
merge keys (``<<``) or tagged collections, and text the parser rejects, go through
PyYAML's pure-Python composer instead (``_load_nodes``), which is slower and gives the
messages for malformed YAML.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

Path_ = tuple[Any, ...]

MAX_NODES = 2_000_000
TOO_LARGE = (f"document too large: more than {MAX_NODES} nodes (aliases that expand it, or more than a spec or "
             "plan holds)")
MAX_DEPTH = 200  # nesting of collections; real files nest a handful deep
MAX_DIGITS = 100  # an int of more digits is refused as it is read (Python's int() stops at 4300)
_MAX_INT = 10**MAX_DIGITS

_PARSER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


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


def _construct(construct: Any, node: yaml.ScalarNode, path: Path_ = ()) -> Any:
    """``construct(node)``, or YamlProblem at the node for a scalar that cannot be read: a number
    of more than MAX_DIGITS digits (int() itself refuses over 4300), an impossible date."""
    where = (node.start_mark.line + 1, node.start_mark.column + 1, path)
    try:
        value = construct(node)
    except ValueError as err:
        if node.tag == "tag:yaml.org,2002:int":
            raise _too_large(*where) from None
        raise YamlProblem(f"cannot read {node.value[:40]!r} as a {node.tag.rsplit(':', 1)[-1]}: {err}; "
                          "quote it to make it a string", *where) from None
    if value.__class__ is int and not -_MAX_INT < value < _MAX_INT:
        raise _too_large(*where)
    return value


def _too_large(line: int | None = None, column: int | None = None, path: Path_ = ()) -> YamlProblem:
    return YamlProblem(f"a number of more than {MAX_DIGITS} digits; no number here is that large",
                       line, column, path)


_PLAIN_TAGS = yaml.resolver.Resolver()
_PLAIN_CONSTRUCTOR = yaml.constructor.SafeConstructor()
_NO_MARK = yaml.Mark("<plain>", 0, 0, 0, None, None)


def construct_plain(text: str) -> Any:
    """The value of ``text`` as a plain (unquoted, untagged) scalar, as ``yaml.SafeLoader`` reads it, or
    YamlProblem (without a line) for a scalar that cannot be read."""
    implicit = _PLAIN_TAGS.yaml_implicit_resolvers
    if text[0] not in implicit and None not in implicit and not _PLAIN_TAGS.yaml_path_resolvers:
        return text  # no implicit type starts so: a string, as it is (Resolver.resolve, construct_yaml_str)
    node = yaml.ScalarNode(_PLAIN_TAGS.resolve(yaml.ScalarNode, text, (True, False)), text, _NO_MARK, _NO_MARK)
    return _construct(_PLAIN_CONSTRUCTOR.construct_object, node)


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
            raise YamlProblem(TOO_LARGE)
        if id(node) in self.open:
            raise YamlProblem("an alias refers to a node that contains it (recursive structure)",
                              self.lines.get(path, _line(node)))
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            self.open.add(id(node))
            try:
                return self._collection(node, path)
            finally:
                self.open.discard(id(node))
        return _construct(self.loader.construct_object, node, path)

    def _collection(self, node: yaml.Node, path: Path_) -> Any:
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        self._check_duplicates(node, path)
        self.loader.flatten_mapping(node)  # resolves `<<` merge keys; explicit keys come last and win
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _construct(self.loader.construct_object, key_node, path)
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
            key = _construct(self.loader.construct_object, key_node, path)
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
                raise YamlProblem(f"duplicate key {key!r}")
            out[key] = value
        return out

    def number(digits: str) -> int:
        value = int(digits) if len(digits) <= MAX_DIGITS + 1 else None
        if value is None or not -_MAX_INT < value < _MAX_INT:
            raise _too_large()
        return value

    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_int=number), {}
    except json.JSONDecodeError:
        return None


def _load_nodes(text: str) -> tuple[Any, dict[Path_, int]]:
    """Parse one YAML/JSON document into plain data and a path -> line map, through PyYAML's
    pure-Python composer: every YAML feature, and the messages for malformed YAML."""
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


# ---------------------------------------------------------------------------
# the fast path: data straight from the parser's events


class _Unsupported(Exception):
    """A feature the event builder leaves to ``_load_nodes`` (anchors, aliases, merge keys,
    tagged collections, more than one document)."""


class _NeedLines(Exception):
    """A duplicate key, or a scalar that cannot be read, met while building without lines (the
    caller re-reads with lines, to name the field)."""


_MISSING = object()
_MERGE = "tag:yaml.org,2002:merge"
_COLLECTION_TAGS = {yaml.MappingStartEvent: "tag:yaml.org,2002:map",
                    yaml.SequenceStartEvent: "tag:yaml.org,2002:seq"}


class _Scalars:
    """Resolves and constructs scalars exactly as ``yaml.SafeLoader`` does, once per distinct
    (tag, value, implicit): the results (str, int, float, bool, None, dates, bytes) are immutable."""

    def __init__(self) -> None:
        self.cache: dict[tuple[Any, str, Any], Any] = {}
        self.resolver = yaml.resolver.Resolver()
        self.constructor = yaml.constructor.SafeConstructor()

    def tag(self, event: yaml.ScalarEvent) -> str:
        if event.tag is None or event.tag == "!":
            return self.resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
        return event.tag

    def value(self, event: yaml.ScalarEvent) -> Any:
        key = (event.tag, event.value, event.implicit)
        try:
            return self.cache[key]
        except KeyError:
            pass
        node = yaml.ScalarNode(self.tag(event), event.value, event.start_mark, event.end_mark, event.style)
        out = self.cache[key] = _construct(self.constructor.construct_object, node)
        return out


def _build_from_events(parser: yaml.SafeLoader, lines: dict[Path_, int] | None) -> Any:
    """The document's data from ``parser``'s events; with ``lines``, fill it with the line map.

    Iterative (no recursion, so no depth limit but ours). Raises _Unsupported, _NeedLines
    (without lines), YamlProblem, or the parser's yaml.YAMLError.
    """
    get = parser.get_event
    event = get()  # StreamStartEvent
    event = get()
    if isinstance(event, yaml.StreamEndEvent):
        return None
    if not isinstance(event, yaml.DocumentStartEvent):
        raise _Unsupported
    scalars = _Scalars()
    known = scalars.cache
    ScalarEvent, MappingStartEvent, SequenceStartEvent = (
        yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)
    MappingEndEvent, SequenceEndEvent = yaml.MappingEndEvent, yaml.SequenceEndEvent
    track = lines is not None
    # the innermost open collection (None before the root), its path (with lines), whether it is
    # a list, and for a mapping the key waiting for its value (_MISSING: the next node is a key);
    # `outer` holds the same of each collection around it (their keys were all given values)
    parent: Any = None
    parent_path: Path_ = ()
    in_list = False
    key: Any = _MISSING
    outer: list[tuple[Any, Path_, bool]] = []
    root: Any = _MISSING
    count = 0
    while True:
        event = get()
        kind = event.__class__
        if kind is ScalarEvent:
            if event.anchor is not None:
                raise _Unsupported
            try:
                value = known[(event.tag, event.value, event.implicit)]
            except KeyError:
                try:
                    value = scalars.value(event)
                except YamlProblem as problem:
                    if not track:
                        raise _NeedLines from None
                    raise _at(problem, parent, parent_path, in_list, key) from None
            is_collection = False
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            if not outer:
                break
            parent, parent_path, in_list = outer.pop()
            key = _MISSING
            continue
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            if event.anchor is not None or (event.tag not in (None, "!", _COLLECTION_TAGS[kind])):
                raise _Unsupported
            value = {} if kind is MappingStartEvent else []
            is_collection = True
        else:
            raise _Unsupported  # an alias; other events cannot happen inside a document
        count += 1
        if count > MAX_NODES:
            raise YamlProblem(TOO_LARGE)
        if parent is None:  # the root
            root = value
            path: Path_ = ()
            if track:
                lines[()] = event.start_mark.line + 1
            if not is_collection:
                break
        elif in_list:
            if track:
                path = parent_path + (len(parent),)
                lines.setdefault(path, event.start_mark.line + 1)
            parent.append(value)
        elif key is _MISSING:  # a key
            mark = event.start_mark
            if is_collection:
                raise YamlProblem("a mapping key must be a plain scalar, not a list or mapping",
                                  mark.line + 1, mark.column + 1)
            if event.value == "<<" and scalars.tag(event) == _MERGE:
                raise _Unsupported
            if value in parent:
                if not track:
                    raise _NeedLines
                first = lines[parent_path + (value,)]
                raise YamlProblem(f"duplicate key (first defined on line {first})",
                                  mark.line + 1, mark.column + 1, path=parent_path + (value,))
            parent[value] = None  # holds the key's place (its order) until the value comes
            key = value
            if track:
                lines[parent_path + (value,)] = mark.line + 1
            continue
        else:
            parent[key] = value
            if track:
                path = parent_path + (key,)
            key = _MISSING
        if is_collection:
            if parent is not None:
                if len(outer) + 1 >= MAX_DEPTH:
                    raise YamlProblem("nested too deeply to read")
                outer.append((parent, parent_path, in_list))
            parent, parent_path, in_list = value, path if track else (), kind is SequenceStartEvent
    if not isinstance(get(), yaml.DocumentEndEvent) or not isinstance(get(), yaml.StreamEndEvent):
        raise _Unsupported  # more than one document: _load_nodes says so
    return root


def _at(problem: YamlProblem, parent: Any, path: Path_, in_list: bool, key: Any) -> YamlProblem:
    """``problem`` (met at the node being built, in collection ``parent`` at ``path``) with the
    path of that node."""
    if parent is not None:
        if in_list:
            path = path + (len(parent),)
        elif key is not _MISSING:
            path = path + (key,)
        problem.path = path
    return problem


def _load_events(text: str, lines: dict[Path_, int] | None) -> Any:
    parser = _PARSER(text)
    try:
        return _build_from_events(parser, lines)
    finally:
        parser.dispose()


def load_with_lines(text: str) -> tuple[Any, dict[Path_, int]]:
    """Parse one YAML/JSON document into plain data and a path -> line map."""
    lines: dict[Path_, int] = {}
    try:
        return _load_events(text, lines), lines
    except (_Unsupported, yaml.YAMLError):
        return _load_nodes(text)


def load_data(text: str) -> Any:
    """Parse one YAML/JSON document into plain data, faster than ``load_with_lines``:
    no line map (re-read with ``load_with_lines`` to report a problem with lines). Plain block
    YAML, the shape of specs, is read by ``schemas.yaml_plain.read_plain`` faster still (schemas.io tries it first)."""
    try:
        return _load_events(text, None)
    except _NeedLines:
        return load_with_lines(text)[0]  # raises the YamlProblem naming both lines
    except (_Unsupported, yaml.YAMLError):
        return _load_nodes(text)[0]
