"""Which predictions a command is about: the plan's own, or new ones for another profile or workload.

``planner show``, ``--chart`` and ``planner explain`` take ``--hardware NAME|FILE`` and
``--workload NAME[=TOKENS]``. Without them a command uses what the plan was predicted
with (the profile it carries, its workloads); a workload the plan names keeps its tokens and
weight. A profile is never looked up by the name a plan records when the plan carries it: a
calibrated profile named ``h200`` is not the bundled ``h200``.
"""

from __future__ import annotations

from schemas.errors import InputError, suggest
from schemas.hardware import bundled_profiles, load_hardware
from schemas.hardware_profile import HardwareProfile
from schemas.plan import Plan
from schemas.prediction import Predictions
from schemas.workload import DEFAULT_TOKENS, DEFAULT_WORKLOAD, Workload, WorkloadItem, parse_workload_option


def plan_workload(plan: Plan) -> Workload:
    """The workloads the plan was predicted for (decode at 1 token for a plan without predictions), with the
    sequences, context and logits its memory section records."""
    if plan.predictions is None:
        return DEFAULT_WORKLOAD
    items = {}
    for p in plan.predictions.workloads:
        f = plan.memory.forward(p.workload) if plan.memory is not None else None
        held = {} if f is None or f.tokens != p.tokens else {
            "batch": f.batch, "context": f.context or None, "logits": f.logits if f.logits != "all" else None}
        items[p.workload] = WorkloadItem(tokens=p.tokens, weight=p.weight, mode=p.mode, **held)
    return Workload(items)


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
    if item.auto:  # the plan is made: its batch was chosen when it was (planner plan -w NAME=auto@CONTEXT)
        raise InputError(f"--workload {option!r}: batch auto is chosen by planner plan, not afterwards; give the batch "
                         f"to predict, e.g. {parsed}=32@{item.context}")
    return Workload({parsed: item})


def chosen_profile(plan: Plan, option: str | None) -> HardwareProfile:
    """``--hardware``, else the profile the plan carries, else (a plan written before plans carried it) the
    bundled profile of its name when its figures are the bundled ones' (the same source), else the default."""
    if option is not None:
        return load_hardware(option)
    preds = plan.predictions
    if preds is None:
        return load_hardware(None)
    if preds.profile is not None:
        return preds.profile
    if preds.hardware in bundled_profiles():
        bundled = load_hardware(preds.hardware)
        if not preds.hardware_source or preds.hardware_source == bundled.source:
            return bundled
        raise InputError(f"predictions.hardware: the plan was predicted with a profile named '{preds.hardware}' "
                         f"from '{preds.hardware_source}', not the bundled '{preds.hardware}' (from "
                         f"'{bundled.source}'), and this plan does not carry it: give that profile with "
                         "--hardware FILE, or re-plan (plans carry their profile now)")
    raise InputError(f"predictions.hardware: the plan was predicted with the profile '{preds.hardware}', which "
                     f"is not bundled (bundled: {', '.join(bundled_profiles())}) and this plan does not carry: "
                     "give it with --hardware FILE, or re-plan (plans carry their profile now)")


def chosen_predictions(plan: Plan, hardware: str | None, workload: str | None) -> Predictions:
    """The plan's stored predictions, or new ones when a profile or a workload is asked for
    (or when the plan has none: a plan written before the cost model)."""
    if hardware is None and workload is None and plan.predictions is not None:
        return plan.predictions
    from planner.cost.predict import predict

    return predict(plan, chosen_profile(plan, hardware), chosen_workload(plan, workload))
