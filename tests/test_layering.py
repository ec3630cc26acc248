"""The rooms stay stacked: schemas <- runtime <- planner. Read from the source with ``ast``:
no module of planner/ or schemas/ imports torch, transformers or runtime at module level, and
planner/ imports runtime only lazily, in the commands that need a built model or a GPU."""

from __future__ import annotations

import ast
from pathlib import Path

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
