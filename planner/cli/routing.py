"""``planner plan --routing FILE``: the measured routing a plan is made with (schemas/routing.py)."""

from __future__ import annotations

from typing import Any

from schemas.errors import InputError


def routing_options(path: str, world_asked: str | None, from_vllm: str | None) -> dict[str, Any]:
    """The keyword arguments of ``planner.plan`` for ``--routing path``, or InputError."""
    from schemas.io import load_routing, source_name
    from schemas.routing import RoutingRef

    if world_asked is not None:
        raise InputError(f"--routing with {world_asked}: measured routing is used for one GPU's plan; "
                         "plan without --tp, or without --routing")
    if from_vllm is not None:
        raise InputError("--routing with --from-vllm: vLLM's flags move whole params, so which experts are used "
                         "most does not change the plan; drop one of them")
    stats, sha = load_routing(path)
    return {"routing": stats, "routing_ref": RoutingRef(file=source_name(path), sha256=sha)}
