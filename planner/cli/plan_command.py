"""What `planner plan` does with its parsed options (planner/cli/app.py declares them, click parses them):
the planner's arguments from the words given, the plan (or a rank set, --tp N) from the spec, and the --check
verdict. `planner check-plans` calls the same two functions for each manifest line
(planner/review/check_plans.py), so a line is checked exactly as `planner plan ... --check PLAN` checks it.

``params`` is click's parsed params of the command, by parameter name (``ctx.params``). Failures are
raised, for the caller to report (planner/cli/errors.py): bad input, an infeasible budget (with a hint
for a budget given without a unit), or a plan the planner made that is not valid (a bug).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from planner.cli.errors import InternalError

SPEC_MODELS = ("SpecFile", "MemorySection", "OffloadSection")  # what `plan` validates of the spec and its options


def make_plan(params: Mapping[str, Any]) -> Any:
    """The plan that `planner plan` makes from ``params`` (a list of rank plans when tensor parallel)."""
    from pydantic import ValidationError

    from planner.errors import InfeasibleError
    from planner.tp.cli import asked, check_request, world_size
    from schemas.errors import InputError, problems_from_validation
    from schemas.io import load_model, read_text, source_name
    from schemas.spec import SpecFile

    spec, check, output = params["spec"], params.get("check"), params.get("output")
    if check is not None or params.get("diff_format") is not None:
        from planner.review.lockfile import check_flags

        check_flags(spec, check, output, params.get("diff_format") is not None)
    options = planner_options(params)
    text = read_text(spec)
    spec_file = load_model(SpecFile, spec, text)
    if options["hardware"] is None:
        from schemas.hardware import spec_hardware

        options["hardware"] = spec_hardware(spec_file.hardware, spec)  # a file: from the spec's folder
    mode = _value(params.get("mode"))
    if mode is not None:
        options["workload"] = _in_mode(options["workload"] or spec_file.workload, mode)
    if params.get("context") is not None:
        options["workload"] = _with_context(options["workload"] or spec_file.workload, params["context"])
    if _value(params.get("objective")) is not None:
        options["workload"] = _for_throughput(options["workload"] or spec_file.workload)
    world = world_size(params.get("tp"), spec_file)
    world_asked = asked(params.get("tp"), world, source_name(spec))
    if world > 1:
        check_request(world, output, check, world_asked)
    if params.get("routing") is not None:
        from planner.cli.routing import routing_options

        options.update(routing_options(params["routing"], world_asked if world > 1 else None, params.get("from_vllm")))
    try:
        return _plans(spec_file, world, world_asked, options, params.get("from_vllm"), spec, text)
    except ValidationError as err:
        if err.title not in SPEC_MODELS:  # a plan the planner made is not valid: a bug, not the user's input
            raise InternalError(err) from None
        where = f"{source_name(spec)} with the command-line options"
        raise InputError(problems_from_validation(err, source=where, root=SpecFile)) from None
    except InfeasibleError as err:
        from planner.cli.errors import missing_unit_hints

        given = _sizes_given(text, spec, {"gpu_budget": params.get("gpu_budget"),
                                          "cpu_budget": params.get("cpu_budget")})
        err.hints = missing_unit_hints(given)
        raise


def _plans(spec_file: Any, world: int, world_asked: str, options: dict[str, Any], from_vllm: str | None, spec: str,
           text: str) -> Any:
    """The plan of one GPU (by the planner's rules, or vLLM's for ``from_vllm``), or the rank plans of ``world``."""
    import planner as core
    from schemas.errors import InputError
    from schemas.io import source_name

    if from_vllm is not None:
        from planner.vllm.cli import plan_from_vllm

        if world > 1:
            raise InputError(f"--from-vllm with {world_asked}: vLLM's flags are read for one GPU's plan; "
                             "plan each rank with --tp and the planner's own options instead")
        return plan_from_vllm(spec_file, from_vllm, options)
    if world == 1:
        return core.plan(spec_file, **options)
    from planner.tp.split import ShardError

    try:
        return core.plan_ranks(spec_file, world, **options)
    except ShardError as err:
        raise err.located(source_name(spec), text) from None


def check_verdict(ctx: Any, fresh: Any, spec: str, committed: str, fmt: str) -> tuple[int, str]:
    """`plan --check`: (exit code, the verdict on the committed plan or rank set as text) (planner/review/lockfile.py,
    planner/review/lockfile_set.py). ``ctx``: click's context, whose words the refresh command repeats."""
    from planner.cli.command_line import words_given
    from planner.review.lockfile import check_plan
    from planner.review.lockfile_render import render_check

    options = words_given(ctx, leave_out=("spec", "check", "diff_format", "output"))
    if isinstance(fresh, list):  # a rank set (--tp N): DIR holds the committed rank plans
        from planner.review.lockfile_render import render_set_check
        from planner.review.lockfile_set import check_rank_set

        checked = check_rank_set(fresh, spec, committed, options)
        return checked.exit_code, render_set_check(checked, fmt)
    verdict = check_plan(fresh, spec, committed, options)
    return verdict.exit_code, render_check(verdict, fmt)


def planner_options(params: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``planner.plan`` that the options give (None where an option is not given)."""
    return {
        "gpu_budget": _size(params.get("gpu_budget"), "--gpu-budget"),
        "cpu_budget": _size(params.get("cpu_budget"), "--cpu-budget"),
        "kv_cache": _kv_cache(params.get("kv_cache")),
        "kv_cache_dtype": _dtype(params.get("kv_cache_dtype"), "--kv-cache-dtype"),
        "backend": _value(params.get("backend")),
        "strategy": _value(params.get("strategy")),
        "group_size": params.get("group_size"),
        "num_in_group": params.get("num_in_group"),
        "prefetch_step": params.get("prefetch_step"),
        "params": _segments(params.get("params")),
        "kinds": _segments(params.get("kinds")),
        "prefer": _segments(params.get("prefer")),
        "backends": _backends(params.get("backends")),
        "workload": _workload(params.get("workload"), params.get("tokens")),
        "hardware": params.get("hardware"),
    }


def _value(choice: Any) -> Any:
    """An Enum choice by its value (None stays None)."""
    return getattr(choice, "value", choice)


def _size(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    from pydantic import ValidationError

    from schemas.errors import InputError, problems_from_validation
    from schemas.sizes import parse_size

    try:
        return parse_size(value)  # the parser allows surrounding spaces, tabs and newlines, nothing more
    except ValidationError as err:
        raise InputError(problems_from_validation(err, prefix=(flag,))) from None


def _kv_cache(value: str | None) -> Any:
    """--kv-cache SIZE|auto: bytes, or "auto" (the rule of memory.kv_cache, schemas.sizes.size_or_auto)."""
    from schemas.sizes import size_or_auto

    return _parsed(value, "--kv-cache", size_or_auto)


def _dtype(value: str | None, flag: str) -> str | None:
    from schemas.dtypes import canonical_dtype

    return _parsed(value, flag, canonical_dtype)


def _parsed(value: str | None, flag: str, parse: Callable[[str], Any]) -> Any:
    """``parse(value)``, its ValueError as the flag's input error; None stays None."""
    if value is None:
        return None
    from schemas.errors import InputError

    try:
        return parse(value)
    except ValueError as err:
        raise InputError(f"{flag}: {err}") from None


def _segments(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def _backends(value: str | None) -> dict[str, str] | None:
    """--backends KIND=BACKEND,... as a dict (the values are checked with the spec's offload section)."""
    if value is None:
        return None
    from schemas.errors import InputError

    out: dict[str, str] = {}
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        kind, sep, backend = (x.strip() for x in part.partition("="))
        if not sep or not kind or not backend:
            raise InputError(f"--backends: '{part}' is not KIND=BACKEND (e.g. routed_experts=uva,attention=prefetch)")
        if kind in out:
            raise InputError(f"--backends: {kind} is given twice")
        out[kind] = backend
    if not out:
        raise InputError("--backends: no KIND=BACKEND given (e.g. routed_experts=uva)")
    return out


def _workload(options: list[str] | None, tokens: int | None) -> Any:
    """--workload/--tokens as a Workload (None: the spec's or the default); the items are parsed and checked
    by schemas.workload, the rules of a spec's workload."""
    if not options and tokens is None:
        return None
    from schemas.errors import InputError
    from schemas.workload import Workload, WorkloadItem, parse_workload_option

    items: dict[str, Any] = {}
    for text in options or []:
        try:
            name, item = parse_workload_option(text)
        except ValueError as err:
            raise InputError(f"--workload: {err}") from None
        if name in items:
            raise InputError(f"--workload: {name} given twice")
        items[name] = item
    if tokens is not None:
        if "decode" in items:
            raise InputError("--tokens sets the decode workload, which --workload gives too; use one of them")
        items["decode"] = WorkloadItem(tokens=tokens)
    return Workload(items)


def _with_context(workload: Any, context: int) -> Any:
    """``workload`` (None: the default one) with --context for every forward that gives none."""
    from pydantic import ValidationError

    from schemas.errors import InputError
    from schemas.workload import DEFAULT_WORKLOAD, first_message

    try:
        return (workload or DEFAULT_WORKLOAD).with_context(context)
    except ValidationError as err:
        raise InputError(f"--context {context}: {first_message(err)}") from None


def _for_throughput(workload: Any) -> Any:
    """--objective throughput: the decode step's batch chosen (batch auto); the workload must say which."""
    from pydantic import ValidationError

    from schemas.errors import InputError
    from schemas.workload import DEFAULT_WORKLOAD, Workload, first_message, is_prefill

    chosen = workload or DEFAULT_WORKLOAD
    if chosen.auto is not None:
        return chosen
    steps = [name for name, _ in chosen.items() if not is_prefill(name)]
    if len(steps) != 1:
        raise InputError("--objective throughput chooses the batch of one decode step, and the workload has "
                         f"{len(steps)} ({', '.join(steps) or 'none'}): say which with -w NAME=auto@CONTEXT")
    name = steps[0]
    item = chosen.root[name]
    if item.context is None:
        raise InputError(f"--objective throughput: workload '{name}' has no context, and the KV cache of the "
                         f"sequences is what bounds the batch: give --context N or -w {name}=auto@N")
    update = {**item.model_dump(exclude_none=True), "batch": "auto"}
    update.pop("tokens", None)
    try:
        return Workload({**chosen.root, name: type(item).model_validate(update)})
    except ValidationError as err:
        raise InputError(f"--objective throughput: {first_message(err)}") from None


def _in_mode(workload: Any, mode: str) -> Any:
    """``workload`` (None: the default one) with every forward run in ``mode`` (--mode)."""
    from schemas.workload import DEFAULT_WORKLOAD, Workload

    chosen = workload or DEFAULT_WORKLOAD
    return Workload({name: item.model_copy(update={"mode": mode}) for name, item in chosen.items()})


def _sizes_given(text: str, spec: str, flags: dict[str, str | None]) -> dict[str, object]:
    """The budgets as the user wrote them: ``{"--gpu-budget": "20"}`` for a flag, else
    ``{"memory.gpu_budget": 20}`` from the spec file."""
    from schemas.io import parse_text, source_name

    memory = parse_text(text, source_name(spec)).get("memory")
    given: dict[str, object] = {}
    for key, flag_value in flags.items():
        if flag_value is not None:
            given[f"--{key.replace('_', '-')}"] = flag_value
        elif isinstance(memory, dict) and key in memory:
            given[f"memory.{key}"] = memory[key]
    return given
