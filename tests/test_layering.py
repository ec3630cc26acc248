"""The rooms stay stacked: schemas <- runtime <- planner. Read from the source with ``ast``:
no module of planner/ or schemas/ imports torch, transformers or runtime at module level, and
planner/ imports runtime only lazily, in the commands that need a built model or a GPU. And no two
modules import each other, directly or around a circle, counting every import (module level, inside
functions, under ``if TYPE_CHECKING``)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "runtime")
# (file, function) pairs allowed to import runtime inside the function
LAZY_RUNTIME = {("planner/cli/app.py", "spec_command"), ("planner/cli/app.py", "calibrate_command")}


def imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def top(name: str) -> str:
    return name.split(".")[0]


def module_level_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Imports that run when the module is imported (inside if/try at the top level too)."""
    out = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        out += [(node.lineno, name) for name in imported(node)]
        stack += list(ast.iter_child_nodes(node))
    return sorted(out)


def function_imports(tree: ast.Module) -> list[tuple[str, int, str]]:
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out += [(fn.name, node.lineno, name) for node in ast.walk(fn) for name in imported(node)]
    return out


def sources(room: str) -> list[Path]:
    return sorted((ROOT / room).rglob("*.py"))


def test_planner_and_schemas_import_no_torch_transformers_or_runtime_at_module_level() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line}: import {name}"
           for room in ("planner", "schemas") for path in sources(room)
           for line, name in module_level_imports(ast.parse(path.read_text()))
           if top(name) in HEAVY]
    assert bad == []


def test_planner_imports_runtime_only_in_the_spec_command() -> None:
    found = {(str(path.relative_to(ROOT)), fn) for path in sources("planner")
             for fn, _, name in function_imports(ast.parse(path.read_text())) if top(name) == "runtime"}
    assert found <= LAZY_RUNTIME


def test_schemas_never_import_planner_or_runtime_and_runtime_never_planner() -> None:
    bad = []
    for room, banned in (("schemas", ("planner", "runtime", "torch")), ("runtime", ("planner",))):
        for path in sources(room):
            for node in ast.walk(ast.parse(path.read_text())):
                bad += [f"{path.relative_to(ROOT)}: {name}" for name in imported(node) if top(name) in banned]
    assert bad == []


def test_the_checker_finds_what_it_looks_for() -> None:
    tree = ast.parse("import os\ntry:\n    import torch\nexcept ImportError:\n    pass\n"
                     "def f():\n    from runtime import describe\n")
    assert [name for _, name in module_level_imports(tree)] == ["os", "torch"]
    assert function_imports(tree) == [("f", 7, "runtime")]


ROOMS = ("schemas", "planner", "runtime")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(files: dict[str, str]) -> nx.DiGraph:
    """Module -> the modules it imports, from ``files`` (module name -> source), every import counted.
    ``from pkg import name`` reads the package ``pkg`` (its ``__init__``), and the module ``pkg.name`` too when
    there is one; ``import a.b`` is the module ``a.b``. A module that imports ``importlib`` also imports
    every module its string constants name (a package's table of names loaded on first use)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(files)

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    for module, text in files.items():
        tree = ast.parse(text)
        targets: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.append(node.module)
                targets += [f"{node.module}.{alias.name}" for alias in node.names
                            if f"{node.module}.{alias.name}" in files]
        if "importlib" in targets:
            targets += [node.value for node in ast.walk(tree)
                        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in files]
        for target in filter(None, map(known, targets)):
            if target != module:
                graph.add_edge(module, target)
    return graph


def test_no_import_circles_among_schemas_planner_and_runtime() -> None:
    files = {module_name(path, ROOT): path.read_text() for room in ROOMS for path in sources(room)}
    circles = sorted((" -> ".join(c) for c in nx.simple_cycles(import_graph(files))), key=len)
    assert circles == []


def test_the_circle_finder_sees_every_kind_of_import() -> None:
    files = {
        "pkg": "from pkg.a import f\n",
        "pkg.a": "from pkg import b\ndef f():\n    pass\n",  # reads the package, which imports pkg.a
        "pkg.b": "def g():\n    from pkg.c import h\n",  # inside a function
        "pkg.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import g\n",
        "pkg.d": "import importlib\nWHERE = {'x': 'pkg.e'}\n",
        "pkg.e": "import pkg.d\n",
    }
    circles = {frozenset(c) for c in nx.simple_cycles(import_graph(files))}
    assert circles == {frozenset({"pkg", "pkg.a"}), frozenset({"pkg.b", "pkg.c"}), frozenset({"pkg.d", "pkg.e"})}
