"""Which predictions a command is about: the plan's own, or new ones for another profile or workload.

``planner show``, ``--chart`` and ``planner explain`` take ``--hardware NAME|FILE`` and
``--workload NAME[=TOKENS]``. Without them a command uses what the plan was predicted
with (its profile, its workloads); a workload the plan names keeps its tokens and weight.
"""

from __future__ import annotations

from schemas.errors import InputError, suggest
from schemas.hardware import HardwareProfile, bundled_profiles, load_hardware
from schemas.plan import Plan
from schemas.prediction import Predictions
from schemas.workload import DEFAULT_TOKENS, DEFAULT_WORKLOAD, Workload, WorkloadItem, parse_workload_option


def plan_workload(plan: Plan) -> Workload:
    """The workloads the plan was predicted for (decode at 1 token for a plan without predictions)."""
    if plan.predictions is None:
        return DEFAULT_WORKLOAD
    return Workload({p.workload: WorkloadItem(tokens=p.tokens, weight=p.weight, mode=p.mode)
                     for p in plan.predictions.workloads})


def chosen_workload(plan: Plan, option: str | None) -> Workload:
    """``--workload``: one of the plan's workloads by name, or ``NAME[=TOKENS][:WEIGHT]``; else all of the plan's."""
    known = plan_workload(plan)
    if option is None:
        return known
    name = option.strip()
    if name in known.root:
        return Workload({name: known.root[name]})
    try:
        parsed, item = parse_workload_option(option)
    except ValueError as err:
        names = ", ".join(known.root)
        close = suggest(name.split("=")[0], [*known.root, *(n for n in DEFAULT_TOKENS if n not in known.root)])
        raise InputError(f"--workload {err}{close}; the plan predicts: {names}") from None
    return Workload({parsed: item})


def chosen_profile(plan: Plan, option: str | None) -> HardwareProfile:
    """``--hardware``, else the profile the plan was predicted with, else the default one."""
    if option is not None:
        return load_hardware(option)
    stored = plan.predictions.hardware if plan.predictions is not None else None
    if stored is not None and stored not in bundled_profiles():
        raise InputError(f"the plan was predicted with the profile '{stored}', which is not bundled "
                         f"(bundled: {', '.join(bundled_profiles())}): give it with --hardware FILE")
    return load_hardware(stored)


def chosen_predictions(plan: Plan, hardware: str | None, workload: str | None) -> Predictions:
    """The plan's stored predictions, or new ones when a profile or a workload is asked for
    (or when the plan has none: a plan written before the cost model)."""
    if hardware is None and workload is None and plan.predictions is not None:
        return plan.predictions
    from planner.predict import predict

    return predict(plan, chosen_profile(plan, hardware), chosen_workload(plan, workload))
