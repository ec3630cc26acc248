"""Tensor parallelism in ``apply``: which rank this process is, which plan is its own, and whether the
model's shards are laid out as that plan says.

A rank plan (``summary.rank`` and ``summary.world_size`` set) describes one rank's part of a
tensor-parallel model: its params' local shapes and how each is split (``shard``). ``apply`` takes a
plan, a plan file, a directory of ``rank{r}.plan.yaml`` files or a sequence of plans indexed by rank,
finds this process's rank (``rank=``, else the rank in ``process_group``, else in the default group of
an initialized ``torch.distributed``) and refuses, before anything moves, a plan made for another rank
or another number of ranks, and a model whose params are split otherwise than the plan says.
Nothing here communicates: each rank checks its own plan against its own shards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.dtensor import layout, shard_problem
from runtime.errors import ApplyError, PlanMismatchError
from runtime.tensors import TensorRef
from schemas import Plan, SpecFile, load_plan
from schemas.errors import InputError
from schemas.rank_plans import load_set, rank_plan_name, set_problems


@dataclass(frozen=True)
class Rank:
    """This process in its tensor-parallel group: ``rank`` and ``world_size`` (None when unknown) and
    where they came from, for messages."""

    rank: int | None
    world_size: int | None
    source: str

    def describe(self) -> str:
        of = f" of {self.world_size}" if self.world_size is not None else ""
        return f"this process is rank {self.rank}{of} ({self.source})"


def this_rank(rank: object = None, process_group: object = None) -> Rank:
    """Who this process is: ``rank=`` when given, else its rank in ``process_group`` (the default group
    when None) of an initialized ``torch.distributed``; rank None when neither applies."""
    if rank is not None and (type(rank) is not int or rank < 0):
        raise ApplyError(f"rank={rank!r}: expected a whole number >= 0 (this process's tensor-parallel rank)")
    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    if process_group is not None and not initialized:
        raise ApplyError("process_group= was given but torch.distributed is not initialized in this process")
    if not initialized:
        return Rank(rank, None, "rank= argument") if rank is not None else Rank(None, None, "not distributed")
    size = torch.distributed.get_world_size(process_group)
    group = "process_group=" if process_group is not None else "the default process group"
    if rank is not None:
        return Rank(rank, size if process_group is not None else None, "rank= argument")
    return Rank(torch.distributed.get_rank(process_group), size, f"torch.distributed, {group} of {size}")


def choose_plan(plan: object, who: Rank) -> tuple[Plan, bool]:
    """This rank's plan from what ``apply`` was given, and whether it was just loaded from a file
    (files are checked on load). Plain plans pass through; the rank checks come after."""
    if isinstance(plan, (str, Path)) and Path(plan).is_dir():
        return _from_directory(Path(plan), who), True
    if isinstance(plan, (str, Path)):
        return load_plan(plan), True
    if isinstance(plan, Plan):
        return plan, False
    if isinstance(plan, Sequence) and not isinstance(plan, (str, bytes)) and plan \
            and all(isinstance(p, Plan) for p in plan):
        return _from_sequence(list(plan), who), False
    hint = " (that is a spec: make a plan from it with planner.plan(spec))" if isinstance(plan, SpecFile) else ""
    raise ApplyError(f"apply() needs a Plan, the path of a plan file, a directory of {rank_plan_name('R')} "
                     f"files or a list of rank plans, got a {type(plan).__name__}{hint}")


def _need_rank(who: Rank, what: str) -> int:
    if who.rank is None:
        raise ApplyError(f"{what} holds plans for several tensor-parallel ranks, but this process's rank is "
                         f"unknown: initialize torch.distributed first, or pass rank=")
    return who.rank


def _from_directory(folder: Path, who: Rank) -> Plan:
    """This rank's plan from a set folder; the whole set is loaded and checked (schemas/rank_plans.py), so
    a folder mixing two sets or missing a rank is refused on every rank alike."""
    rank = _need_rank(who, f"the directory {folder}")
    plans = load_set(folder)
    if rank >= len(plans):
        raise InputError(f"{folder}: no plan for rank {rank}: the folder holds the plans of {len(plans)} ranks; "
                         f"{who.describe()}")
    return plans[rank]


def _from_sequence(plans: list[Plan], who: Rank) -> Plan:
    rank = _need_rank(who, f"the list of {len(plans)} plans")
    problems = set_problems(plans, [f"plans[{i}]" for i in range(len(plans))])
    if rank >= len(plans):
        problems.append(f"no plan for rank {rank}: the list holds {len(plans)}; {who.describe()}")
    if problems:
        raise PlanMismatchError(problems, plans[0].summary.model)
    return plans[rank]


def plan_label(plan: Plan) -> str:
    s = plan.summary
    return "the plan" if s.world_size is None else f"the plan for rank {s.rank} of {s.world_size}"


def rank_problems(plan: Plan, who: Rank) -> list[str]:
    """A rank plan used by another rank, or by a group of another size."""
    s = plan.summary
    if s.world_size is None:
        return []
    if who.rank is None:
        return [f"{plan_label(plan)} is a tensor-parallel rank plan, but this process's rank is unknown: "
                f"initialize torch.distributed first, or pass rank="]
    problems = []
    if s.rank != who.rank:
        problems.append(f"{plan_label(plan)} cannot run on rank {who.rank} ({who.source}); "
                        f"apply {rank_plan_name(who.rank)}")
    if who.world_size is not None and who.world_size != s.world_size:
        problems.append(f"{plan_label(plan)} was made for {s.world_size} ranks but {who.describe()}; "
                        f"make the plans again for {who.world_size} ranks")
    return problems


def layout_problems(plan: Plan, refs: Mapping[tuple[str, str], TensorRef], device: torch.device) -> list[str]:
    """Params whose DTensor layout differs from the plan's ``shard`` (a rank plan), or that this
    runtime cannot offload (meshes of several dims, Partial placements, a mesh on another device type).
    ``refs``: the plan's names as found in the model (runtime/check.py)."""
    problems = []
    label = plan_label(plan)
    for layer in plan.layers:
        for rel, want in layer.params.items():
            ref = refs.get((layer.name, rel))
            if ref is None:
                continue  # the check of the model reports it
            t, full = ref.tensor, f"{layer.name}.{rel}"
            problem = shard_problem(full, t, want.shard, plan.summary.world_size, label)
            if problem:
                problems.append(problem)
            mesh_type = layout(t).device_type
            if mesh_type is not None and mesh_type != device.type:
                problems.append(f"'{full}' is a DTensor on a {mesh_type} device mesh but apply's device is "
                                f"{device.type}: apply on the mesh's device")
    return problems
