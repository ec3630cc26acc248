"""The plan file: which params stay on the GPU, which live in host memory, and how they come back.

A plan is the planner's output and the runtime's input. It is deterministic and
meant to be read and diffed in review: every layer in execution order with all of
its params (so the runtime can check the model against it), which of them are
offloaded and, of those, which GPU kernels read in place through UVA (``uva``); every
other offloaded param is prefetched: the plan gives the buffer slot its layer uses and
the point at which its copy starts.

``Plan`` is a plan's content (``schemas.plan_content``: the fields, layer by layer) validated against itself
(``schemas.plan_check``, which reads the content, so it never needs this module).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ValidationInfo, model_validator

from schemas.plan_check import findings_text, plan_findings
from schemas.plan_content import PlanContent

OLD_STEP_MESSAGE = ("plan_version 1: this plan was written by an older planner whose prefetch_step meant slots - 1; "
                    "make the plan again with `planner plan SPEC`")


def old_step_version(data: Any) -> bool:
    """Plan data of version 1, whose prefetch_step meant slots - 1: refused alone, nothing else about it matters."""
    return isinstance(data, dict) and type(data.get("plan_version")) is int and data["plan_version"] == 1


DEFER_CHECK = "defer_plan_check"  # validation context key: the caller runs the plan check itself


class Plan(PlanContent):
    # (no docstring: the JSON Schema of plan files, `planner schema plan`, is PlanContent's fields alone)
    FILE_KIND: ClassVar[str] = "plan"

    @model_validator(mode="before")
    @classmethod
    def _not_version_1(cls, data: Any) -> Any:
        if old_step_version(data):
            raise ValueError(OLD_STEP_MESSAGE)
        return data

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Plan:
        """Every derived field agrees with the rest (schemas/plan_check.py). ``schemas.io`` loads with
        ``context={DEFER_CHECK: True}`` and runs the check itself, to point at the lines of the file."""
        if not (info.context or {}).get(DEFER_CHECK):
            findings = plan_findings(self)
            if findings:
                raise ValueError(findings_text(findings))
        return self
