"""Writing a spec compactly: a param with only a shape is its shape list, defaults are omitted.

``dump_spec`` is what ``planner spec`` writes; loading its output gives back an equal spec.
"""

from __future__ import annotations

from typing import Any

from schemas.dtypes import itemsize
from schemas.io import dump_json, dump_yaml
from schemas.sizes import format_bytes
from schemas.spec import SpecFile


def compact_spec(spec: SpecFile) -> dict[str, Any]:
    """The spec as plain data without default values; ``{shape: [..]}`` params become ``[..]``."""
    data = spec.model_dump(mode="json", exclude_defaults=True)
    for layer in data["model"]["layers"]:
        params = layer.get("params", {})
        for rel, p in params.items():
            if set(p) == {"shape"}:
                params[rel] = p["shape"]
    for section in ("memory", "offload"):
        if not data.get(section):
            data.pop(section, None)
    return data


def spec_header(spec: SpecFile, made_by: str) -> str:
    """A comment saying how the spec was made and what it holds (tied tensors counted once)."""
    layers = spec.model.expanded()
    elements = sum(t.nbytes // itemsize(t.dtype) for layer in layers for t in layer.params if not t.buffer)
    nbytes = sum(t.nbytes for layer in layers for t in layer.params)
    return (f"Made by: {made_by}\n"
            f"{len(layers)} layers, {elements:,} parameters ({elements / 1e9:.2f} B), "
            f"{format_bytes(nbytes)} of params and buffers")


def dump_spec(spec: SpecFile, fmt: str = "yaml", header: str | None = None) -> str:
    """YAML (optionally after ``header`` as ``#`` comment lines) or JSON text of ``spec``, compact."""
    data = compact_spec(spec)
    if fmt == "json":
        return dump_json(data)
    text = dump_yaml(data)
    if header:
        text = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines()) + text
    return text
