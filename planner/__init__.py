"""Offload planner: a YAML model/memory spec in, a reviewable offload plan out. Never imports torch.

``plan`` (and ``plan_ranks``/``write_rank_plans`` for tensor parallel) is loaded on first use, so ``import planner`` (and the CLI's start-up) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.build import plan
    from planner.tp.ranks import plan_ranks
    from planner.tp.output import write_rank_plans

__all__ = ["plan", "plan_ranks", "write_rank_plans"]


def __getattr__(name: str) -> Any:
    if name == "plan":
        from planner.build import plan

        return plan
    if name == "plan_ranks":
        from planner.tp.ranks import plan_ranks

        return plan_ranks
    if name == "write_rank_plans":
        from planner.tp.output import write_rank_plans

        return write_rank_plans
    raise AttributeError(f"module 'planner' has no attribute '{name}'")
