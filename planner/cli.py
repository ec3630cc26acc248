"""The `planner` command line: plan, validate, show, diff, schema.

Exit codes: 0 ok, 1 infeasible budget (or `diff` found changes), 2 bad input.
Start-up stays fast: only typer is imported here at module level; pydantic, the
schemas, networkx and the planner core are imported inside the commands.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, NoReturn, Optional

import typer

EXIT_OK, EXIT_CHANGED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INFEASIBLE = 1

def _epilog(*examples: str, tail: str = "") -> str:
    """Examples kept verbatim (click's \\b marker stops re-wrapping), then a paragraph of notes."""
    lines = "\n".join(f"  {e}" for e in examples)
    return f"Examples:\n\n\b\n{lines}\n\n{tail}".rstrip()


app = typer.Typer(
    name="planner",
    help="Plan which weights of a PyTorch model live in host memory and how they come back to the GPU.",
    epilog=_epilog(
        "planner plan examples/llama-3-8b.yaml --gpu-budget 12GB -o llama.plan.yaml",
        "planner show llama.plan.yaml",
        "planner diff old.plan.yaml new.plan.yaml --format markdown",
        tail="Exit codes: 0 ok, 1 infeasible budget or diff found changes, 2 bad input.",
    ),
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: half the start-up time of rich-rendered help
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _choices(name: str, values: str) -> type[Enum]:
    """A str Enum of the space-separated ``values`` (typer shows them as the allowed choices)."""
    return Enum(name, [(v, v) for v in values.split()], type=str)  # type: ignore[return-value]


PlanFormat = _choices("PlanFormat", "yaml json")
ShowFormat = _choices("ShowFormat", "text json")
DiffFormat = _choices("DiffFormat", "text markdown json")
Backend = _choices("Backend", "auto prefetch uva none")
Strategy = _choices("Strategy", "budget group")
SchemaKind = _choices("SchemaKind", "spec plan")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"planner {version('offload-planner')}")
        except PackageNotFoundError:
            typer.echo("planner (not installed)")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Plan which weights of a PyTorch model live in host memory and how they come back to the GPU."""


# ---------------------------------------------------------------------------
# option parsing helpers


def _is(exc: BaseException, module: str, name: str) -> bool:
    """isinstance against a class of a module only if that module was imported (keeps start-up lean)."""
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(exc, cls)


def _fail(message: str, code: int, hint: Optional[str] = None) -> NoReturn:
    for line in str(message).splitlines() or [""]:
        typer.echo(f"error: {line}", err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    raise typer.Exit(code)


def _handle(exc: Exception) -> NoReturn:
    """Known failures become a message and an exit code; anything else is a bug and keeps its traceback."""
    if _is(exc, "planner.errors", "InfeasibleError"):
        message = exc.message  # type: ignore[attr-defined]
        need = exc.min_gpu_budget  # type: ignore[attr-defined]
        hint = None
        if need is not None:
            if str(need) not in message:
                message += f"\nthe smallest feasible GPU budget is {need} bytes"
            hint = f"rerun with --gpu-budget {_gib_up(need)} or more"
        _fail(message, EXIT_INFEASIBLE, hint)
    if _is(exc, "schemas.errors", "InputError") or _is(exc, "planner.errors", "PlanningError"):
        _fail(exc.message, EXIT_BAD_INPUT)  # type: ignore[attr-defined]
    if _is(exc, "pydantic", "ValidationError"):
        from schemas.errors import problems_from_validation

        _fail("\n".join(map(str, problems_from_validation(exc))), EXIT_BAD_INPUT)  # type: ignore[arg-type]
    if _is(exc, "yaml", "YAMLError"):
        _fail(f"malformed YAML: {exc}", EXIT_BAD_INPUT)
    if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(f"{where}{exc.strerror or exc}", EXIT_BAD_INPUT)
    raise exc


def _reports(command: Callable[..., None]) -> Callable[..., None]:
    """Wrap a command so that bad input ends in a message and exit 2 (or 1), not a traceback."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except typer.Exit:
            raise
        except Exception as exc:  # noqa: BLE001 - known kinds are reported, the rest re-raised
            _handle(exc)

    return run


def _size(value: Optional[str], flag: str) -> Optional[int]:
    if value is None:
        return None
    from pydantic import ValidationError

    from schemas.errors import InputError, problems_from_validation
    from schemas.sizes import parse_size

    try:
        return parse_size(value)  # the parser allows surrounding spaces, tabs and newlines, nothing more
    except ValidationError as err:
        raise InputError(problems_from_validation(err, prefix=(flag,))) from None


def _segments(value: Optional[str]) -> Optional[list[str]]:
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def _gib_up(n: int) -> str:
    return f"{-(-n * 100 // 2**30) / 100:.2f}GiB"


# ---------------------------------------------------------------------------
# commands

PLAN_EPILOG = _epilog(
    "planner plan examples/llama-3-8b.yaml --gpu-budget 12GB",
    "planner plan spec.yaml --gpu-budget '20 GiB' --backend uva -o plan.yaml",
    "planner plan spec.yaml --strategy group --group-size 4 --num-in-group 1 --format json",
    "cat spec.yaml | planner plan - --gpu-budget 1.5TB > plan.yaml",
    tail="Sizes: a number of bytes or a number with a unit; GB/MB/TB are powers of 10, GiB/MiB/TiB "
    "powers of 2.\n\nExit codes: 0 planned, 1 nothing fits the budget (the smallest feasible budget "
    "is printed), 2 bad input."
)


@app.command("plan", short_help="Make an offload plan from a spec and a GPU budget.", epilog=PLAN_EPILOG)
@_reports
def plan_command(
    spec: Annotated[str, typer.Argument(
        metavar="SPEC", help="Spec file (YAML or JSON); '-' reads stdin.", show_default=False)],
    gpu_budget: Annotated[Optional[str], typer.Option(
        "--gpu-budget", "-g", help="GPU bytes for weights plus offload buffers, e.g. 20GB (overrides memory.gpu_budget).",
        show_default=False)] = None,
    cpu_budget: Annotated[Optional[str], typer.Option(
        "--cpu-budget", help="Cap on pinned host bytes, e.g. 64GiB (overrides memory.cpu_budget).",
        show_default=False)] = None,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write the plan here (atomically); '-' or none: stdout.", show_default=False)] = None,
    fmt: Annotated[PlanFormat, typer.Option("--format", "-f", help="Plan file format.")] = PlanFormat.yaml,  # type: ignore[attr-defined]
    backend: Annotated[Optional[Backend], typer.Option(
        "--backend", help="Overrides offload.backend.", show_default=False)] = None,
    strategy: Annotated[Optional[Strategy], typer.Option(
        "--strategy", help="Overrides offload.strategy.", show_default=False)] = None,
    group_size: Annotated[Optional[int], typer.Option(
        "--group-size", min=1, help="Strategy group: offload the last K of every N block layers (N).",
        show_default=False)] = None,
    num_in_group: Annotated[Optional[int], typer.Option(
        "--num-in-group", min=1, help="Strategy group: K, how many of every group are offloaded.",
        show_default=False)] = None,
    prefetch_step: Annotated[Optional[int], typer.Option(
        "--prefetch-step", min=1, help="Prefetch: how many offloaded layers ahead the copy stream runs.",
        show_default=False)] = None,
    params: Annotated[Optional[str], typer.Option(
        "--params", help="Comma-separated name segments eligible for offload, e.g. mlp,self_attn.",
        show_default=False)] = None,
    kinds: Annotated[Optional[str], typer.Option(
        "--kinds", help="Comma-separated param kinds eligible for offload, e.g. routed_experts,shared_experts "
        "(with --params: both must match).", show_default=False)] = None,
    prefer: Annotated[Optional[str], typer.Option(
        "--prefer", help="Strategy budget: offload these kinds in order, e.g. routed_experts,dense_mlp,attention.",
        show_default=False)] = None,
) -> None:
    """Make an offload plan from a spec. Flags override the spec file's memory and offload sections."""
    from pydantic import ValidationError

    import planner as core
    from schemas.errors import InputError, problems_from_validation
    from schemas.io import dump_model, load_spec, source_name
    from schemas.spec import SpecFile

    options: dict[str, Any] = {
        "gpu_budget": _size(gpu_budget, "--gpu-budget"),
        "cpu_budget": _size(cpu_budget, "--cpu-budget"),
        "backend": backend.value if backend else None,
        "strategy": strategy.value if strategy else None,
        "group_size": group_size,
        "num_in_group": num_in_group,
        "prefetch_step": prefetch_step,
        "params": _segments(params),
        "kinds": _segments(kinds),
        "prefer": _segments(prefer),
    }
    spec_file = load_spec(spec)
    try:
        result = core.plan(spec_file, **options)
    except ValidationError as err:
        where = f"{source_name(spec)} with the command-line options"
        raise InputError(problems_from_validation(err, source=where, root=SpecFile)) from None
    from planner.output import emit

    emit(dump_model(result, fmt.value), output)


@app.command("validate", short_help="Check a spec or a plan file; print its key facts.", epilog=_epilog(
    "planner validate examples/llama-3-8b.yaml", "planner validate llama.plan.yaml",
    tail="Exit codes: 0 valid, 2 not valid (each problem with file, line and field)."
))
@_reports
def validate_command(
    file: Annotated[str, typer.Argument(metavar="FILE", help="A spec or a plan file (YAML or JSON); '-' reads stdin.",
                                        show_default=False)],
) -> None:
    """Check a spec or a plan file and say which it is, with its key facts."""
    from planner.show import describe
    from schemas.io import load_spec_or_plan, source_name

    typer.echo(f"{source_name(file)}: {describe(load_spec_or_plan(file))}")


@app.command("show", short_help="Show a plan as a per-layer table with totals.", epilog=_epilog(
    "planner show llama.plan.yaml", "planner show llama.plan.yaml --format json | jq .totals"
))
@_reports
def show_command(
    plan_file: Annotated[str, typer.Argument(metavar="PLAN", help="A plan file; '-' reads stdin.",
                                             show_default=False)],
    fmt: Annotated[ShowFormat, typer.Option("--format", "-f", help="Table (text) or rows as JSON.")] = ShowFormat.text,
) -> None:
    """Show a plan per layer: resident and offloaded bytes, offloaded params, slot and copy trigger; totals."""
    from planner import show
    from schemas.io import load_plan

    plan = load_plan(plan_file)
    if fmt is ShowFormat.json:
        sys.stdout.write(show.render_json(plan))
        return
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=160)  # piped or captured: no need to squeeze
    show.render_table(plan, console)


@app.command("diff", short_help="Compare two plans (exit 1 when they differ).", epilog=_epilog(
    "planner diff main.plan.yaml branch.plan.yaml",
    "planner diff old.plan.yaml new.plan.yaml --format markdown >> $GITHUB_STEP_SUMMARY",
    tail="Exit codes (like diff): 0 the plans are equal, 1 they differ, 2 bad input."
))
@_reports
def diff_command(
    old: Annotated[str, typer.Argument(metavar="OLD", help="The old plan file.", show_default=False)],
    new: Annotated[str, typer.Argument(metavar="NEW", help="The new plan file.", show_default=False)],
    fmt: Annotated[DiffFormat, typer.Option("--format", "-f", help="text, markdown (for a pull request) or json.")
                   ] = DiffFormat.text,
) -> None:
    """Compare two plans: params that moved between GPU and host, backend/strategy/step changes, memory deltas."""
    from schemas.io import load_plan

    old_plan, new_plan = load_plan(old), load_plan(new)
    from planner.diff import diff_plans, render_diff

    result = diff_plans(old_plan, new_plan)
    text = render_diff(result, fmt.value)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    raise typer.Exit(EXIT_CHANGED if result.changed else EXIT_OK)


@app.command("spec", short_help="Write a spec from a safetensors checkpoint or a Hugging Face config.", epilog=_epilog(
    "planner spec --from-safetensors model.safetensors",
    "planner spec --from-safetensors checkpoints/llama/ -o llama.yaml      # index + shards",
    "planner spec --from-hf-config config.json --name llama-3-8b -o llama.yaml",
    tail="--from-safetensors reads only the file headers. --from-hf-config builds the model on the "
    "meta device (no weights) and needs transformers: pip install 'offload-planner[hf]'.\n\n"
    "Exit codes: 0 written, 2 bad input."
))
@_reports
def spec_command(
    from_safetensors: Annotated[Optional[str], typer.Option(
        "--from-safetensors", metavar="PATH",
        help="A .safetensors file, or a folder with model.safetensors.index.json and its shards.",
        show_default=False)] = None,
    from_hf_config: Annotated[Optional[str], typer.Option(
        "--from-hf-config", metavar="CONFIG", help="A Hugging Face config.json (or its folder).",
        show_default=False)] = None,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write the spec here (atomically); '-' or none: stdout.", show_default=False)] = None,
    name: Annotated[Optional[str], typer.Option(
        "--name", help="model.name in the spec (default: the file or folder name).", show_default=False)] = None,
    fmt: Annotated[PlanFormat, typer.Option("--format", "-f", help="Spec file format.")] = PlanFormat.yaml,  # type: ignore[attr-defined]
) -> None:
    """Write a spec (layers in execution order, identical blocks folded) from a checkpoint's headers
    or from a model config."""
    from schemas.errors import InputError

    if (from_safetensors is None) == (from_hf_config is None):
        raise InputError("give exactly one of --from-safetensors PATH and --from-hf-config CONFIG")
    if name is not None and not name.strip():
        raise InputError("--name: must not be empty")
    if from_safetensors is not None:
        from planner.sources.safetensors_header import spec_from_safetensors

        spec_file, made_by = spec_from_safetensors(from_safetensors, name), f"--from-safetensors {from_safetensors}"
    else:
        from planner.sources.hf_config import spec_from_hf_config

        spec_file, made_by = spec_from_hf_config(from_hf_config, name), f"--from-hf-config {from_hf_config}"
    from planner.output import emit
    from schemas.spec_dump import dump_spec, spec_header

    made_by += f" --name {name}" if name else ""
    emit(dump_spec(spec_file, fmt.value, spec_header(spec_file, f"planner spec {made_by}")), output)


@app.command("schema", short_help="Print the JSON Schema of spec or plan files.", epilog=_epilog(
    "planner schema spec -o spec.schema.json", "planner schema plan"
))
@_reports
def schema_command(
    kind: Annotated[SchemaKind, typer.Argument(metavar="spec|plan", help="Which file format.", show_default=False)],
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write the schema here (atomically); '-' or none: stdout.", show_default=False)] = None,
) -> None:
    """Print the JSON Schema of spec or plan files, for editors to validate and complete them."""
    import json

    from planner.output import emit
    from schemas.plan import Plan
    from schemas.spec import SpecFile

    model = SpecFile if kind is SchemaKind.spec else Plan
    emit(json.dumps(model.model_json_schema(), indent=2) + "\n", output)


# ---------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> None:
    try:
        app(args=argv, prog_name="planner")
    except BrokenPipeError:  # `planner show plan.yaml | head`: stop quietly
        sys.stderr.close()
        sys.exit(EXIT_CHANGED)
    except SystemExit as done:
        if argv is not None:  # called from Python: behave like any function that exits
            raise
        # the command line: everything is written (files atomically, streams flushed here), so
        # skip tearing down the interpreter's modules, which costs ~0.1 s on a large plan
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:
            code = EXIT_CHANGED
        os._exit(code)


if __name__ == "__main__":
    main()
