"""File formats of the offload planner: the model/memory spec and the plan (pure data).

The names below load on first use (PEP 562), so ``import schemas.exit_codes`` (the CLI's start-up) costs no
pydantic; ``from schemas import Plan`` works as before.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "InputError": "schemas.errors",
    "dump_model": "schemas.io", "load_plan": "schemas.io", "load_spec": "schemas.io",
    "Plan": "schemas.plan",
    "BufferKey": "schemas.plan_content", "BufferPool": "schemas.plan_content", "PlanLayer": "schemas.plan_content",
    "PlanParam": "schemas.plan_content", "Prefetch": "schemas.plan_content", "Summary": "schemas.plan_content",
    "format_bytes": "schemas.sizes", "parse_size": "schemas.sizes",
    "MemorySection": "schemas.spec", "ModelSection": "schemas.spec", "OffloadSection": "schemas.spec",
    "SpecFile": "schemas.spec",
    "Layer": "schemas.spec_layers", "LayerSpec": "schemas.spec_layers", "ParamSpec": "schemas.spec_layers",
    "Tensor": "schemas.spec_layers",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'schemas' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
