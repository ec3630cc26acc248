"""The `planner` command line: plan, validate, show, diff, check-plans, schema.

Exit codes: schemas/exit_codes.py (0 ok, 1 infeasible budget or `diff` found changes, 2 bad
input, 70 internal error, 141 stdout closed early); how an exception becomes one:
planner/cli/errors.py. Start-up stays fast: only typer is imported here at module level;
pydantic, the schemas and the planner core are imported inside the commands. The annotations are
evaluated as the module is read (no ``from __future__ import annotations``): typer reads every command's
annotations at each run, and evaluating them from strings took 0.03 s of it.
"""

import functools
import gc
import os
import sys
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, Optional

import typer

from planner.cli import exit_codes
from planner.cli.strict import StrictCommand
from planner.cli.exit_codes import exit_codes_note

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
        tail=exit_codes_note("0 ok", "1 infeasible budget or diff found changes", "2 bad input", closed_pipe=True),
    ),
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: half the start-up time of rich-rendered help
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command = functools.partial(app.command, cls=StrictCommand)  # type: ignore[method-assign]  # every command


def _choices(name: str, values: str) -> type[Enum]:
    """A str Enum of the space-separated ``values`` (typer shows them as the allowed choices)."""
    return Enum(name, [(v, v) for v in values.split()], type=str)  # type: ignore[return-value]


PlanFormat = _choices("PlanFormat", "yaml json")
ShowFormat = _choices("ShowFormat", "text json")
DiffFormat = _choices("DiffFormat", "text markdown json")
ReviewFormat = _choices("ReviewFormat", "text markdown")
Backend = _choices("Backend", "auto prefetch uva none")
Strategy = _choices("Strategy", "auto budget group")
SchemaKind = _choices("SchemaKind", "spec plan")
ExecMode = _choices("ExecMode", "eager graph")  # schemas.workload.MODES
Objective = _choices("Objective", "throughput")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"planner {version('offload-planner')}")
        except PackageNotFoundError:
            typer.echo("planner (not installed)")
        raise typer.Exit(exit_codes.OK)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", help=f"On an internal error, show the traceback (also: {exit_codes.DEBUG_ENV}=1).")] = False,
) -> None:
    """Plan which weights of a PyTorch model live in host memory and how they come back to the GPU."""
    _run_options["debug"] = debug  # set on every run, so one in-process run does not leak into the next


# ---------------------------------------------------------------------------
# option parsing helpers


_run_options: dict[str, bool] = {"debug": False}  # the global options of the run in progress


def _debug() -> bool:
    """--debug given (to the root command) or PLANNER_DEBUG set to anything but '' or 0."""
    return _run_options["debug"] or os.environ.get(exit_codes.DEBUG_ENV, "") not in ("", "0")


def _reports(command: Callable[..., None]) -> Callable[..., None]:
    """Wrap a command so that it ends on an exception with a message and its exit code
    (planner/cli/errors.py), never a traceback unless --debug asks for one."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(exit_codes.INTERRUPTED) from None
        except Exception as exc:  # noqa: BLE001 - every failure gets its message and exit code
            from planner.cli.errors import report

            raise typer.Exit(report(exc, _debug())) from None

    return run


# ---------------------------------------------------------------------------
# commands

PLAN_EPILOG = _epilog(
    "planner plan examples/llama-3-8b.yaml --gpu-budget 12GB",
    "planner plan spec.yaml --gpu-budget '20 GiB' --backend uva -o plan.yaml",
    "planner plan spec.yaml --strategy group --group-size 4 --num-in-group 1 --format json",
    "cat spec.yaml | planner plan - --gpu-budget 1.5TB > plan.yaml",
    "planner plan spec.yaml --gpu-budget 8GB --workload decode --workload prefill=2048:0.1 --hardware h200",
    "planner plan moe.yaml --gpu-budget 24GB --backends routed_experts=uva,attention=prefetch",
    "planner plan spec.yaml --gpu-budget 12GB --check plan.yaml      # is the committed plan.yaml up to date?",
    "planner plan spec.yaml --gpu-budget 12GB --check plan.yaml --diff-format markdown >> $GITHUB_STEP_SUMMARY",
    tail="Sizes: a number of bytes or a number with a unit; GB/MB/TB are powers of 10, GiB/MiB/TiB "
    "powers of 2.\n\n--check PLAN writes no plan: it makes the plan again with the same options and compares "
    "it with PLAN (equal after loading, predictions included); when they differ it prints the diff (committed -> "
    "now) in --diff-format and the command that refreshes PLAN. --format stays the plan file's format.\n\n"
    + exit_codes_note(
        "0 planned (--check: PLAN is up to date)", "1 nothing fits the budget (the smallest feasible budget is "
        "printed) or, with --check, PLAN differs, was made from another spec or by an older planner", "2 bad input")
)


@app.command("plan", short_help="Make an offload plan from a spec and a GPU budget.", epilog=PLAN_EPILOG)
@_reports
def plan_command(
    ctx: typer.Context,
    spec: Annotated[str, typer.Argument(
        metavar="SPEC", help="Spec file (YAML or JSON); '-' reads stdin.", show_default=False)],
    gpu_budget: Annotated[Optional[str], typer.Option(
        "--gpu-budget", "-g", help="The GPU memory the plan may use, e.g. 20GB: weights, offload buffers, KV cache, "
        "activations and workspace (overrides memory.gpu_budget).", show_default=False)] = None,
    cpu_budget: Annotated[Optional[str], typer.Option(
        "--cpu-budget", help="Cap on pinned host bytes, e.g. 64GiB (overrides memory.cpu_budget).",
        show_default=False)] = None,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write the plan here (atomically); '-' or none: stdout.", show_default=False)] = None,
    fmt: Annotated[PlanFormat, typer.Option("--format", "-f", help="Plan file format (with --check: the "
                                            "refresh command's; --diff-format is the diff's).")
                   ] = PlanFormat.yaml,  # type: ignore[attr-defined]
    backend: Annotated[Optional[Backend], typer.Option(
        "--backend", help="Overrides offload.backend.", show_default=False)] = None,
    strategy: Annotated[Optional[Strategy], typer.Option(
        "--strategy", help="Overrides offload.strategy: auto (the default; budget when --prefer is given), "
        "budget or group.", show_default=False)] = None,
    group_size: Annotated[Optional[int], typer.Option(
        "--group-size", min=1, help="Strategy group: offload the last K of every N block layers (N).",
        show_default=False)] = None,
    num_in_group: Annotated[Optional[int], typer.Option(
        "--num-in-group", min=1, help="Strategy group: K, how many of every group are offloaded.",
        show_default=False)] = None,
    prefetch_step: Annotated[Optional[int], typer.Option(
        "--prefetch-step", min=1, help="Prefetch: number of buffer slots, as vLLM's --offload-prefetch-step (default 2).",
        show_default=False)] = None,
    params: Annotated[Optional[str], typer.Option(
        "--params", help="Comma-separated name segments eligible for offload, e.g. mlp,self_attn.",
        show_default=False)] = None,
    kinds: Annotated[Optional[str], typer.Option(
        "--kinds", help="Comma-separated param kinds eligible for offload, e.g. routed_experts,shared_experts "
        "(with --params: both must match).", show_default=False)] = None,
    prefer: Annotated[Optional[str], typer.Option(
        "--prefer", help="Strategies auto and budget: offload these kinds first, in this order, "
        "e.g. routed_experts,dense_mlp,attention.",
        show_default=False)] = None,
    backends: Annotated[Optional[str], typer.Option(
        "--backends", metavar="KIND=BACKEND,...", help="A backend per kind for its offloaded params, e.g. "
        "routed_experts=uva,attention=prefetch; other kinds use --backend (overrides offload.backends).",
        show_default=False)] = None,
    routing: Annotated[Optional[str], typer.Option(
        "--routing", metavar="FILE", help="Measured routing of the MoE layers (runtime.record_routing, "
        "schemas/routing.py): the most used experts stay on the GPU in what the budget leaves, and the predictions "
        "use the measured rates; the plan names the file and its sha256.", show_default=False)] = None,
    hardware: Annotated[Optional[str], typer.Option(
        "--hardware", metavar="NAME|FILE", help="Hardware profile for the predicted step times: a bundled name "
        "(h200) or a file from `planner calibrate` (overrides the spec's hardware; default h200).",
        show_default=False)] = None,
    workload: Annotated[Optional[list[str]], typer.Option(
        "--workload", "-w", metavar="NAME[=TOKENS|=auto][@CONTEXT][:WEIGHT]", help="A forward to plan for, "
        "repeatable: decode (1 token), prefill (2048), decode=32, prefill=4096:0.1, decode=32@4096 (32 sequences "
        "with a 4,096-token KV cache each), decode=auto@4096 (the batch with the most tokens per second) "
        "(overrides the spec's workload).", show_default=False)] = None,
    tokens: Annotated[Optional[int], typer.Option(
        "--tokens", min=1, help="Shorthand for --workload decode=N (a decode step at batch N).",
        show_default=False)] = None,
    context: Annotated[Optional[int], typer.Option(
        "--context", min=1, max=10**9, metavar="N", help="Tokens each sequence holds in the KV cache, for every "
        "forward that gives no @CONTEXT (without it no KV cache is counted).", show_default=False)] = None,
    kv_cache: Annotated[Optional[str], typer.Option(
        "--kv-cache", metavar="SIZE|auto", help="Reserve SIZE for the KV cache (at least what the workload needs), "
        "or auto: give it whatever the plan leaves of the budget, reported as sequences x context (overrides "
        "memory.kv_cache).", show_default=False)] = None,
    kv_cache_dtype: Annotated[Optional[str], typer.Option(
        "--kv-cache-dtype", metavar="DTYPE", help="dtype of the cached keys and values, e.g. float8_e4m3fn "
        "(overrides memory.kv_cache_dtype; default the model's).", show_default=False)] = None,
    objective: Annotated[Optional[Objective], typer.Option(
        "--objective", help="throughput: choose the decode step's batch with the plan for the most predicted "
        "tokens per second, as -w decode=auto@CONTEXT does [default: the workload's batches].",
        show_default=False)] = None,
    mode: Annotated[Optional[ExecMode], typer.Option(
        "--mode", help="How every workload runs: eager (the CPU issues each kernel: its time counts) or graph "
        "(CUDA graph replay, as in transformers' static-cache generate() or torch.compile(mode="
        "\"reduce-overhead\"): no CPU issue time) [default: the workload's, else eager].",
        show_default=False)] = None,
    check: Annotated[Optional[str], typer.Option(
        "--check", metavar="PLAN", help="Write nothing: compare the plan with the committed PLAN ('-': stdin); "
        "exit 1 with the diff and the refresh command when they differ.", show_default=False)] = None,
    diff_format: Annotated[Optional[DiffFormat], typer.Option(
        "--diff-format", help="With --check: the diff as text, markdown (for a pull request) or json "
        "[default: text].", show_default=False)] = None,
    from_vllm: Annotated[Optional[str], typer.Option(
        "--from-vllm", metavar="FLAGS", help="The plan vLLM executes for these offload flags, by vLLM's rules, e.g. "
        "\"--offload-group-size 8 --offload-num-in-group 2\" or \"--cpu-offload-gb 4\" (replaces the spec's "
        "offload section).", show_default=False)] = None,
    tp: Annotated[Optional[int], typer.Option(
        "--tp", min=1, metavar="N", help="Tensor parallel over N GPUs: write one plan per rank, "
        "DIR/rank0.plan.yaml ... (-o DIR needed for N > 1; budgets are per GPU; overrides parallel.tp).",
        show_default=False)] = None,
) -> None:
    """Make an offload plan from a spec. Flags override the spec file's memory and offload sections.
    With --check PLAN, compare it with a committed plan instead of writing it."""
    from planner.cli.plan_command import check_verdict, make_plan
    from schemas.io import dump_model

    result = make_plan(ctx.params)
    if check is not None:
        code, verdict = check_verdict(ctx, result, spec, check, diff_format.value if diff_format else "text")
        sys.stdout.write(verdict)
        raise typer.Exit(code)
    if isinstance(result, list):  # a rank set (--tp N)
        from planner.tp.cli import write_set

        write_set(result, output, fmt.value)  # type: ignore[arg-type]
        return
    from planner.cli.output import emit

    emit(dump_model(result, fmt.value), output)


@app.command("validate", short_help="Check a spec or a plan file; print its key facts.", epilog=_epilog(
    "planner validate examples/llama-3-8b.yaml", "planner validate llama.plan.yaml",
    tail=exit_codes_note("0 valid", "2 not valid (each problem with file, line and field)")
))
@_reports
def validate_command(
    file: Annotated[str, typer.Argument(metavar="FILE", help="A spec or a plan file (YAML or JSON); '-' reads stdin; "
                                        "a folder of rank plans (--tp): each plan and the set.", show_default=False)],
) -> None:
    """Check a spec or a plan file and say which it is, with its key facts."""
    from planner.cli.show import describe
    from schemas.io import load_spec_or_plan, source_name
    from schemas.plan import Plan
    from schemas.rank_plans import check_in_its_set, load_set, rank_files

    if os.path.isdir(file) and rank_files(file):  # a folder of rank plans: each plan, and the set
        plans = load_set(file)
        typer.echo(f"{file}: a set of {len(plans)} rank plans; rank 0: {describe(plans[0])}")
        return
    loaded = load_spec_or_plan(file)
    if isinstance(loaded, Plan) and file != "-":
        check_in_its_set(file, loaded)
    typer.echo(f"{source_name(file)}: {describe(loaded)}")

@app.command("show", short_help="Show a plan per layer with totals and predicted step times; --chart draws it.",
             epilog=_epilog(
    "planner show llama.plan.yaml", "planner show llama.plan.yaml --format json | jq .predictions",
    "planner show llama.plan.yaml --chart llama.png",
    "planner show llama.plan.yaml --hardware my-gpu.yaml --workload prefill=4096 --chart prefill.svg",
    tail="--chart needs matplotlib: pip install 'offload-planner[chart]'.\n\n"
    + exit_codes_note("0 shown", "2 bad input", closed_pipe=True)
))
@_reports
def show_command(
    plan_file: Annotated[str, typer.Argument(metavar="PLAN", help="A plan file; '-' reads stdin; a folder of rank "
                                             "plans (--tp): the ranks side by side.", show_default=False)],
    fmt: Annotated[ShowFormat, typer.Option("--format", "-f", help="Table (text) or rows as JSON.")] = ShowFormat.text,
    chart: Annotated[Optional[str], typer.Option(
        "--chart", metavar="FILE", help="Also draw bytes per layer and one predicted forward to FILE "
        "(.png, .svg or .pdf).", show_default=False)] = None,
    hardware: Annotated[Optional[str], typer.Option(
        "--hardware", metavar="NAME|FILE", help="Predict again with this profile (a bundled name or a file; "
        "default: the one the plan was predicted with).", show_default=False)] = None,
    workload: Annotated[Optional[str], typer.Option(
        "--workload", metavar="NAME[=TOKENS]", help="Show (and chart) this workload only: one of the plan's, "
        "or e.g. prefill=4096 (default: all of the plan's; the chart draws the first).", show_default=False)] = None,
) -> None:
    """Show a plan per layer: resident and offloaded bytes, offloaded params, slot and copy trigger; totals;
    the predicted step time per workload (compute, copy, stall, CPU and what bounds it)."""
    from planner.cli import show
    from planner.cost.predicted import chosen_predictions
    from schemas.io import load_plan

    if os.path.isdir(plan_file):
        from planner.tp.show import show_set

        show_set(plan_file, fmt.value, chart, hardware, workload, _console)
        return
    plan = load_plan(plan_file)
    if chart is not None:
        from planner.cli.chart import check_chart_path

        check_chart_path(chart)
    predictions = chosen_predictions(plan, hardware, workload)
    if chart is not None:
        _draw_chart(plan, chart, hardware, workload)
    if fmt is ShowFormat.json:
        sys.stdout.write(show.render_json(plan, predictions))
        return
    show.render_table(plan, _console(), predictions)
    if chart is not None:
        typer.echo(f"chart written to {chart}")


def _console() -> Any:
    """A rich Console on stdout that, when stdout is closed early, raises BrokenPipeError (rich's
    own choice is to exit 1, the code of an infeasible budget) so that the command ends quietly."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(32, "stdout was closed")

    console = PipeConsole(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = PipeConsole(highlight=False, width=160)  # piped or captured: no need to squeeze
    return console


def _draw_chart(plan: Any, path: str, hardware: Optional[str], workload: Optional[str]) -> None:
    from planner.cli import chart as drawing
    from planner.cli.output import write_output
    from planner.cost.predicted import chosen_profile, chosen_workload

    name, item = chosen_workload(plan, workload).items()[0]
    drawn = drawing.chart(plan, chosen_profile(plan, hardware), name, item.rows)
    write_output(path, drawing.render(drawn, drawing.check_chart_path(path).suffix))


@app.command("explain", short_help="Compare a plan's predicted forward with the runtime's measured stats.",
             epilog=_epilog(
    "planner explain llama.plan.yaml --measured stats.json",
    "planner explain llama.plan.yaml --measured stats.json --workload decode=8 --format json",
    tail="STATS.json is runtime.apply(..., stats=True)'s Handle.stats() written with json.dump "
    "(its format: schemas/measured.py).\n\n" + exit_codes_note("0 explained", "2 bad input")
))
@_reports
def explain_command(
    plan_file: Annotated[str, typer.Argument(metavar="PLAN", help="The plan the run used.", show_default=False)],
    measured: Annotated[str, typer.Option(
        "--measured", "-m", metavar="STATS.json", help="Handle.stats() of a run with this plan, as JSON.",
        show_default=False)],
    hardware: Annotated[Optional[str], typer.Option(
        "--hardware", metavar="NAME|FILE", help="Predict with this profile (default: the plan's).",
        show_default=False)] = None,
    workload: Annotated[Optional[str], typer.Option(
        "--workload", metavar="NAME[=TOKENS]", help="The forward the run measured: one of the plan's workloads "
        "or e.g. decode=8 (default: the plan's first).", show_default=False)] = None,
    fmt: Annotated[ShowFormat, typer.Option("--format", "-f", help="text or json.")] = ShowFormat.text,
) -> None:
    """Per prefetched layer, predicted vs measured copy time and stall, the largest misses first; the totals."""
    from planner.cli import explain
    from planner.cost.predicted import chosen_profile, chosen_workload
    from schemas.io import load_plan, source_name
    from schemas.measured import load_measured

    plan = load_plan(plan_file)
    stats = load_measured(measured)
    name, item = chosen_workload(plan, workload).items()[0]
    result = explain.explain(plan, stats, chosen_profile(plan, hardware), name, item.rows, source_name(measured))
    if fmt is ShowFormat.json:
        sys.stdout.write(explain.render_json(result))
    else:
        sys.stdout.write(explain.render_text(result, source_name(measured)))


@app.command("diff", short_help="Compare two plans (exit 1 when they differ).", epilog=_epilog(
    "planner diff main.plan.yaml branch.plan.yaml",
    "planner diff old.plan.yaml new.plan.yaml --format markdown >> $GITHUB_STEP_SUMMARY",
    tail=exit_codes_note("(like diff) 0 the plans are equal", "1 they differ", "2 bad input")
))
@_reports
def diff_command(
    old: Annotated[str, typer.Argument(metavar="OLD", help="The old plan file (or folder of rank plans).",
                                       show_default=False)],
    new: Annotated[str, typer.Argument(metavar="NEW", help="The new plan file (or folder of rank plans: "
                                       "compared rank by rank).", show_default=False)],
    fmt: Annotated[DiffFormat, typer.Option("--format", "-f", help="text, markdown (for a pull request) or json.")
                   ] = DiffFormat.text,
) -> None:
    """Compare two plans: params that moved between GPU and host, backend/strategy/step changes, memory deltas."""
    from schemas.errors import InputError
    from schemas.io import load_plan

    if os.path.isdir(old) or os.path.isdir(new):
        from planner.tp.show import diff_set_folders

        raise typer.Exit(diff_set_folders(old, new, fmt.value))
    if old == new == "-":
        raise InputError("OLD and NEW both read stdin: give one of them as a file")
    old_plan, new_plan = load_plan(old), load_plan(new)
    from planner.review.diff import diff_plans
    from planner.review.diff_render import render_diff

    result = diff_plans(old_plan, new_plan)
    text = render_diff(result, fmt.value)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    raise typer.Exit(exit_codes.CHANGED if result.changed else exit_codes.OK)


@app.command("check-plans", short_help="Check committed plans against the commands that make them (pre-commit, CI).",
             epilog=_epilog(
    "planner check-plans                               # every plan planner-plans.sh makes",
    "planner check-plans examples/llama-3-8b.yaml      # the plans made from it (pre-commit passes changed files)",
    "planner check-plans --diff-format markdown >> $GITHUB_STEP_SUMMARY",
    "planner check-plans --list                        # the plans, one a line",
    tail="The manifest has one `planner plan SPEC [options] -o PLAN` a line (the refresh command `plan --check` "
    "prints; paths relative to its folder), so `sh planner-plans.sh` makes every plan again. Each line is run "
    "with --check PLAN instead of -o PLAN. A given file no line names is not checked, unless it is missing or "
    "a plan (bad input: no line says how it is made).\n\n"
    + exit_codes_note("0 every plan checked is up to date", "1 some plan is out of date, missing or does not "
                      "fit its budget", "2 bad input (a manifest line, a spec, a file given)")
))
@_reports
def check_plans_command(
    ctx: typer.Context,
    files: Annotated[Optional[list[str]], typer.Argument(
        metavar="FILE", help="Changed files: check the plans made from them or written to them "
        "(default: every plan).", show_default=False)] = None,
    manifest: Annotated[Optional[str], typer.Option(
        "--manifest", metavar="FILE", help="The plans manifest: one `planner plan ... -o PLAN` a line "
        "(default: planner-plans.sh in the current folder).", show_default=False)] = None,
    diff_format: Annotated[ReviewFormat, typer.Option(
        "--diff-format", help="The diff of a plan out of date: text, or markdown for a pull request.")
                           ] = ReviewFormat.text,  # type: ignore[attr-defined]
    list_only: Annotated[bool, typer.Option("--list", help="Print the plans that would be checked; check none.")
                         ] = False,
) -> None:
    """Check committed plans: check each manifest line that FILES concern as `planner plan ... --check PLAN`
    does; print each diff and the refresh command."""
    from planner.review.check_plans import check, exit_code, select
    from planner.review.check_plans_render import outcome_text, summary
    from planner.review.manifest import MANIFEST, read_manifest

    plan_command = ctx.parent.command.get_command(ctx.parent, "plan")  # type: ignore[union-attr]
    manifest = manifest or MANIFEST
    selection = select(read_manifest(manifest, plan_command), files or [], manifest)
    for problem in selection.problems:
        print(f"error: {problem}", file=sys.stderr)
    if list_only:
        sys.stdout.write("".join(f"{entry.plan}\n" for entry in selection.entries))
        raise typer.Exit(exit_code([], selection))
    outcomes = []
    for entry in selection.entries:  # each verdict said as it comes, the counts last
        outcomes.append(check(entry, plan_command, diff_format.value, _debug()))
        out, err = outcome_text(outcomes[-1], manifest, diff_format.value == "markdown")
        sys.stdout.write(out)
        sys.stdout.flush()
        sys.stderr.write(err)
        sys.stderr.flush()
    sys.stdout.write(summary(outcomes, selection, manifest))
    raise typer.Exit(exit_code(outcomes, selection))


ExportTarget = _choices("ExportTarget", "vllm")


@app.command("export", short_help="Print the vLLM flags that make a plan, or why none do.", epilog=_epilog(
    "planner export llama.plan.yaml --to vllm",
    "vllm serve meta-llama/Meta-Llama-3-8B $(planner export llama.plan.yaml --to vllm)",
    "planner export llama.plan.yaml --to vllm --format json -o flags.json",
    tail="A plan vLLM cannot run (a budget spread, a mixed backend, an offloaded embedding) is explained part by "
    "part, with the closest plan vLLM's flags can make and its predicted cost.\n\n"
    + exit_codes_note("0 the flags are printed", "1 the plan is not expressible in vLLM's flags", "2 bad input")
))
@_reports
def export_command(
    plan_file: Annotated[str, typer.Argument(metavar="PLAN", help="A plan file; '-' reads stdin.", show_default=False)],
    to: Annotated[ExportTarget, typer.Option("--to", help="The engine whose flags to print.")],  # type: ignore[valid-type]
    fmt: Annotated[ShowFormat, typer.Option("--format", "-f", help="text (the flags on one line) or json.")
                   ] = ShowFormat.text,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write here (atomically); '-' or none: stdout.", show_default=False)] = None,
) -> None:
    """Print the vLLM offload flags that make this plan; when none can, say which part and the closest plan."""
    from planner.cli.output import emit
    from planner.vllm.export import export
    from planner.vllm.export_render import render
    from schemas.io import load_plan, source_name

    result = export(load_plan(plan_file))
    emit(render(result, source_name(plan_file), fmt.value), output)
    raise typer.Exit(exit_codes.OK if result.flags is not None else exit_codes.INFEASIBLE)


@app.command("spec", short_help="Write a spec from a safetensors checkpoint or a Hugging Face config.", epilog=_epilog(
    "planner spec --from-safetensors model.safetensors",
    "planner spec --from-safetensors checkpoints/llama/ -o llama.yaml      # index + shards",
    "planner spec --from-hf-config config.json --name llama-3-8b -o llama.yaml",
    tail="--from-safetensors reads only the file headers. --from-hf-config builds the model on the "
    "meta device (no weights) and needs transformers: pip install 'offload-planner[hf]'.\n\n"
    + exit_codes_note("0 written", "2 bad input")
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
        try:
            from runtime.hf_config import spec_from_hf_config
        except ImportError as err:  # torch missing: runtime/ cannot be imported
            raise InputError(f"--from-hf-config needs torch and transformers ({err.name} is not installed): "
                             "pip install 'offload-planner[hf]'") from None

        spec_file, made_by = spec_from_hf_config(from_hf_config, name), f"--from-hf-config {from_hf_config}"
    from planner.cli.output import emit
    from schemas.spec_dump import dump_spec, spec_header

    made_by += f" --name {name}" if name else ""
    emit(dump_spec(spec_file, fmt.value, spec_header(spec_file, f"planner spec {made_by}")), output)


@app.command("calibrate", short_help="Measure this machine's GPU into a hardware profile.", epilog=_epilog(
    "planner calibrate -o my-gpu.yaml",
    "planner plan spec.yaml --gpu-budget 8GB --hardware my-gpu.yaml",
    tail="Needs torch with CUDA and a GPU; takes about a minute (52-55 s on the H200). Measures the host-to-GPU "
    "link, UVA reads by token count, GPU memory and matmul rates, attention's read of a KV cache, eager-PyTorch "
    "CPU costs (with transformers installed: per decoder block and per routed expert, and a block's GPU "
    "floor in CUDA graph replay; measured at the start and again at the end, the lower of each kept), and the "
    "host CPU's routed-expert kernel for the cpu backend (its rate and its cost a touched expert at 1, 2 and "
    "4 rows an expert, solved from two expert sizes).\n\n"
    + exit_codes_note("0 written", "2 no GPU here or bad input")
))
@_reports
def calibrate_command(
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write the profile here (atomically); '-' or none: stdout.", show_default=False)] = None,
    name: Annotated[Optional[str], typer.Option(
        "--name", help="The profile's name (default: from the GPU's name).", show_default=False)] = None,
    device: Annotated[str, typer.Option("--device", help="The CUDA device to measure.")] = "cuda",
) -> None:
    """Measure the local GPU (link, UVA, memory, matmul, CPU issue costs) into a hardware profile."""
    from schemas.errors import InputError

    if name is not None:  # the rule of a profile's name, before a minute of measuring
        from schemas.spec_names import check_name

        try:
            if not name:
                raise ValueError("--name: must not be empty")
            check_name(name, "--name")
        except ValueError as err:
            raise InputError(str(err)) from None
    try:
        import torch
    except ImportError:
        raise InputError("calibrate needs torch with CUDA: pip install 'offload-planner[runtime]'") from None
    if not torch.cuda.is_available():
        raise InputError("calibrate measures a CUDA GPU, and torch sees none on this machine")
    from planner.cli.output import emit
    from runtime.calibrate import calibrate
    from schemas.io import dump_model

    profile, raw = calibrate(device, name)
    if raw["steady"]["unsteady"]:
        print(f"warning: {raw['steady']['unsteady']}", file=sys.stderr)
    emit(dump_model(profile, "yaml"), output)


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

    from planner.cli.output import emit
    from schemas.plan import Plan
    from schemas.spec import SpecFile

    model = SpecFile if kind is SchemaKind.spec else Plan
    emit(json.dumps(model.model_json_schema(), indent=2) + "\n", output)


# ---------------------------------------------------------------------------


PLUGINS_ENV = "PYDANTIC_DISABLE_PLUGINS"


def main(argv: Optional[list[str]] = None) -> None:
    """The `planner` command. With ``argv`` (called from Python) it raises SystemExit like any
    click program; on the command line it ends the process with the exit code itself.

    On the command line the cycle collector is off: a command reads its files, computes and writes, and what it
    makes lives until the process ends (at once, below), so a collection finds next to nothing (about a thousand
    objects after a 1,000-layer plan) and costs time (0.16 s of that plan's 2.1 s, measured on a loaded machine).
    And pydantic's plugins are not looked for (``PYDANTIC_DISABLE_PLUGINS``, unless set): finding them reads the
    entry points of every installed package, 0.02-0.03 s of every run, and the command uses none; set
    ``PYDANTIC_DISABLE_PLUGINS=`` (empty) to have them loaded."""
    if argv is None:
        gc.disable()
        os.environ.setdefault(PLUGINS_ENV, "__all__")
    try:
        app(args=argv, prog_name="planner")
        code = exit_codes.OK
    except SystemExit as done:
        if argv is not None:
            raise
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - outside any command (parsing, help): still no traceback
        if argv is not None:
            raise
        from planner.cli.errors import report

        code = report(exc, _debug())
    # everything is written (files atomically, streams flushed here), so skip tearing down the
    # interpreter's modules, which costs ~0.1 s on a large plan
    os._exit(_flush(code))


def _flush(code: int) -> int:
    """Flush stdout and stderr; the exit code, BROKEN_PIPE when stdout was closed early."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        from planner.cli.errors import silence_stdout

        silence_stdout()
        return exit_codes.BROKEN_PIPE
    return code


if __name__ == "__main__":
    main()
