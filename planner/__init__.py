"""Offload planner: a YAML model/memory spec in, a reviewable offload plan out. Never imports torch.

``plan`` is loaded on first use, so ``import planner`` (and the CLI's start-up) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.build import plan

__all__ = ["plan"]


def __getattr__(name: str) -> Any:
    if name == "plan":
        from planner.build import plan

        return plan
    raise AttributeError(f"module 'planner' has no attribute '{name}'")
