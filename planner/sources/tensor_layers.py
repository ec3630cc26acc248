"""Checkpoint tensors grouped into layers by name, in execution order.

``<stack>.<N>.<rest>`` belongs to the block ``<stack>.<N>``, any other tensor to its module
(``model.norm.weight`` -> ``model.norm``, or the outermost such module above it). Layers are
ordered embeddings, other modules, the block stacks by index, final norms, the head.
"""

from __future__ import annotations

import re

from planner.sources.safetensors_file import HeaderTensor
from schemas.errors import InputError
from schemas.spec_build import LayerEntry

_BLOCK = re.compile(r"^(.+?)\.(\d+)\.(.+)$")
_HEADS = {"lm_head", "head", "output", "score", "classifier", "embed_out"}


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _rank(layer: str, stack: str | None) -> int:
    """0 embeddings, 1 other modules, 2 blocks, 3 final norms, 4 the head."""
    last = layer.rsplit(".", 1)[-1]
    if stack is not None:
        return 2
    if last in _HEADS:
        return 4
    if "embed" in layer or last in ("wte", "wpe"):
        return 0
    if "norm" in last or last in ("ln_f",):
        return 3
    return 1


def group_layers(tensors: list[HeaderTensor]) -> list[LayerEntry]:
    """Layers of the tensors (by name), in execution order, tensors within a layer by name."""
    blocks: dict[str, str] = {}  # block layer -> its stack prefix
    members: dict[str, list[tuple[str, HeaderTensor]]] = {}
    modules: set[str] = set()
    for t in tensors:
        m = _BLOCK.match(t.name)
        if m:
            blocks[f"{m.group(1)}.{m.group(2)}"] = m.group(1)
        elif "." in t.name:
            modules.add(t.name.rpartition(".")[0])
        else:
            raise InputError(f"{t.file}: tensor '{t.name}' has no module path (expected names such as "
                             "'model.norm.weight'), so it cannot be placed in a layer")
    for t in tensors:
        m = _BLOCK.match(t.name)
        if m:
            layer = f"{m.group(1)}.{m.group(2)}"
        else:
            module = t.name.rpartition(".")[0]
            parts = module.split(".")
            layer = next(".".join(parts[:k]) for k in range(1, len(parts) + 1)
                         if ".".join(parts[:k]) in modules)
        members.setdefault(layer, []).append((t.name[len(layer) + 1:], t))

    def key(layer: str) -> tuple:
        stack = blocks.get(layer)
        return (_rank(layer, stack), _natural(stack or ""), _natural(layer))

    entries = []
    for layer in sorted(members, key=key):
        params = {rel: {"shape": list(t.shape), "dtype": t.dtype}
                  for rel, t in sorted(members[layer], key=lambda x: _natural(x[0]))}
        entries.append(LayerEntry(layer, params))
    return entries
