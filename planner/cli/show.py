"""`planner show`: a plan as a per-layer table (rich) or as JSON rows, with totals and predicted step times."""

from __future__ import annotations

import json
from typing import Any

from schemas.plan import Plan
from schemas.plan_content import PREFETCHING
from schemas.plan_memory import PART_WORDS
from schemas.prediction import Predictions
from schemas.sizes import format_bytes


def layer_rows(plan: Plan) -> list[dict[str, Any]]:
    """One row a layer, in execution order: what stays, what moves, where it lands and when."""
    rows = []
    for i, layer in enumerate(plan.layers):
        pf = layer.prefetch
        rows.append({
            "index": i,
            "name": layer.name,
            "resident_bytes": layer.resident_bytes,
            "offloaded_bytes": layer.offloaded_bytes,
            "offloaded": list(layer.offloaded),
            "uva": list(layer.uva),
            "slot": None if pf is None else pf.slot,
            "span": False if pf is None else pf.span,
            "copy_before": None if pf is None else pf.copy_before,
            "previous_forward": False if pf is None else pf.previous_forward,
            "once": False if pf is None else pf.once,
        })
    return rows


def totals(plan: Plan) -> dict[str, Any]:
    s = plan.summary
    return {
        "layers": len(plan.layers),
        "offloaded_layers": sum(1 for layer in plan.layers if layer.offloaded),
        "resident_bytes": sum(layer.resident_bytes for layer in plan.layers),
        "offloaded_bytes": sum(layer.offloaded_bytes for layer in plan.layers),
        "buffer_bytes": s.buffer_bytes,
        "peak_gpu_bytes": s.peak_gpu_bytes,
        "pinned_host_bytes": s.pinned_host_bytes,
        "gpu_budget_bytes": s.gpu_budget_bytes,
        **({} if plan.memory is None else dict(plan.memory.parts())),
    }


def peak_parts(plan: Plan) -> str:
    """``resident 11.00 GiB + buffers 416.00 MiB + KV cache 0 B + ...``: what the peak is made of."""
    s, mem = plan.summary, plan.memory
    parts = [("resident", s.resident_bytes), ("buffers", s.buffer_bytes)]
    if mem is not None:
        parts += [(PART_WORDS[name], n) for name, n in mem.parts(listed=True)]
    return " + ".join(f"{what} {format_bytes(n)}" for what, n in parts)


def memory_lines(plan: Plan) -> list[str]:
    """Per forward: what the plan assumed it holds and what it needs; the KV cache's room; the batch chosen."""
    mem = plan.memory
    if mem is None:
        return []
    per_token = "" if mem.kv_bytes_per_token is None else f", {format_bytes(mem.kv_bytes_per_token)} a token"
    out = [f"KV cache {format_bytes(mem.kv_cache_bytes)} ({mem.kv_cache}; {mem.kv_cache_dtype}{per_token})"
           + (f": {mem.kv_tokens:,} tokens" if mem.kv_tokens else "")]
    for f in mem.forwards:
        cache = (f"KV cache {f.batch:,} x {f.context:,} tokens {format_bytes(f.kv_cache_bytes)}" if f.context
                 else "no KV cache counted")
        out.append(f"  {f.workload}: {f.tokens:,} tokens in {f.batch:,} sequence{'s' * (f.batch != 1)}, {cache}, "
                   f"activations {format_bytes(f.activation_bytes)} at {f.largest}"
                   + (", logits of the last token" if f.logits == "last" else ""))
    t = plan.throughput
    if t is not None:
        tried = ", ".join(f"{o.batch}: {o.tokens_per_s:,.1f}" for o in t.options)
        out.append(f"batch {t.batch} chosen for {t.workload} at {t.context:,} tokens: {t.tokens_per_s:,.1f} tokens/s "
                   f"predicted (tokens/s by batch: {tried}; {t.tried} batches planned)")
    return out


def describe(doc: Any) -> str:
    """One line for `planner validate`: which kind of file it is and its key facts."""
    from schemas.spec import SpecFile

    if isinstance(doc, SpecFile):
        layers = doc.model.expanded()
        total = sum(layer.nbytes for layer in layers)
        mem, off = doc.memory, doc.offload
        budget = (f", gpu_budget {int(mem.gpu_budget)} bytes ({format_bytes(mem.gpu_budget)})"
                  if mem.gpu_budget is not None else "")
        return (f"valid spec: model {doc.model.name}, {len(layers)} layers "
                f"({len(doc.model.layers)} entries), {format_bytes(total)} of weights in {doc.model.dtype} by default"
                f"{budget}, backend {off.backend}, strategy {off.strategy}")
    s = doc.summary
    step = f", prefetch_step {s.prefetch_step}" if s.prefetch_step is not None else ""
    return (f"valid plan: model {s.model}, backend {s.backend}, strategy {s.strategy}{step}, "
            f"{s.offloaded_layers} of {s.layers} layers offloaded, peak GPU {format_bytes(s.peak_gpu_bytes)}, "
            f"pinned host {format_bytes(s.pinned_host_bytes)}")


def render_json(plan: Plan, predictions: Predictions | None = None) -> str:
    """``predictions``: what to show (default the plan's own)."""
    s = plan.summary
    preds = predictions or plan.predictions
    head = {"model": s.model, "backend": s.backend, "strategy": s.strategy, "prefetch_step": s.prefetch_step}
    body = {"layers": layer_rows(plan), "totals": totals(plan),
            "memory": None if plan.memory is None else plan.memory.model_dump(mode="json"),
            "throughput": None if plan.throughput is None else plan.throughput.model_dump(mode="json"),
            "predictions": None if preds is None else preds.model_dump(mode="json")}
    return json.dumps({**head, **body}, indent=2) + "\n"


RICH_ROWS = 2_000  # above this many layers, `planner show` prints the per-layer table as plain text

PREDICTION_COLUMNS = (("step ms", "step_ms"), ("compute ms", "compute_ms"), ("copy ms", "copy_ms"),
                      ("stall ms", "stall_ms"), ("CPU ms", "cpu_ms"))


def render_predictions(preds: Predictions, console: Any) -> None:
    """The predicted step time of each workload, what it is made of and what bounds it."""
    from rich.table import Table

    source = f" ({preds.hardware_source})" if preds.hardware_source else ""
    console.print(f"predicted on {preds.hardware}{source}:", highlight=False, markup=False)
    table = Table(header_style="bold")
    table.add_column("workload", no_wrap=True)
    table.add_column("tokens", justify="right", no_wrap=True)
    modes = any(p.mode != "eager" for p in preds.workloads)  # eager only: the table as before modes existed
    if modes:
        table.add_column("mode", no_wrap=True)
    for title, _ in PREDICTION_COLUMNS:
        table.add_column(title, justify="right", no_wrap=True)
    table.add_column("bound by", no_wrap=True)
    for p in preds.workloads:
        table.add_row(p.workload, str(p.tokens), *([p.mode] if modes else []),
                      *(f"{getattr(p, key):.3f}" for _, key in PREDICTION_COLUMNS), p.bound)
    console.print(table)
    if len(preds.workloads) > 1:
        console.print(f"weighted step: {preds.weighted_step_ms:.3f} ms", highlight=False, markup=False)


def _trigger(row: dict[str, Any]) -> str:
    if row["copy_before"] is None:
        return ""
    if row["once"]:
        return "once, at apply time"
    return row["copy_before"] + (" (prev. forward)" if row["previous_forward"] else "")


def _offloaded_cell(row: dict[str, Any], mixed: bool) -> str:
    if not mixed or not row["uva"]:
        return ", ".join(row["offloaded"])
    on_uva = set(row["uva"])
    return ", ".join(f"{p} (uva)" if p in on_uva else p for p in row["offloaded"])


def render_table(plan: Plan, console: Any, predictions: Predictions | None = None) -> None:
    """Print the summary, the per-layer table (plain text above RICH_ROWS layers), the totals and the
    predictions (default the plan's own) on a rich Console."""
    s = plan.summary
    step = f", prefetch_step {s.prefetch_step}" if s.prefetch_step is not None else ""
    console.print(f"[bold]{s.model}[/bold]: backend [cyan]{s.backend}[/cyan] ({s.backend_reason}), "
                  f"strategy {s.strategy}{step}", highlight=False, markup=True)
    prefetch = s.backend in PREFETCHING
    mixed = s.backend == "mixed"  # mark the UVA params; the others are prefetched
    t = totals(plan)
    if len(plan.layers) > RICH_ROWS:
        _plain_table(plan, t, prefetch, mixed, console)
    else:
        _rich_table(plan, t, prefetch, mixed, console)
    _summary_lines(plan, t, console, predictions)


def _cells(row: dict[str, Any], prefetch: bool, mixed: bool) -> list[str]:
    cells = [str(row["index"]), row["name"], format_bytes(row["resident_bytes"]),
             format_bytes(row["offloaded_bytes"]) if row["offloaded_bytes"] else "-",
             _offloaded_cell(row, mixed)]
    if prefetch:
        cells += ["span" if row["span"] else "" if row["slot"] is None else str(row["slot"]), _trigger(row)]
    return cells


def _plain_table(plan: Plan, t: dict[str, Any], prefetch: bool, mixed: bool, console: Any) -> None:
    """The per-layer table as aligned plain text, one line a layer (rich takes about a millisecond a row,
    which is 20 s for 20,000 layers): the same columns and cells, no box, no wrapping."""
    head = ["#", "layer", "resident", "offloaded", "offloaded params"] + (["slot", "copy before"] if prefetch else [])
    right = {0, 2, 3, 5}
    foot = ["", "total", format_bytes(t["resident_bytes"]), format_bytes(t["offloaded_bytes"]), ""] + (
        ["", ""] if prefetch else [])
    from rich.cells import cell_len

    rows = [head] + [_cells(row, prefetch, mixed) for row in layer_rows(plan)] + [foot]
    widths = [max(cell_len(r[c]) for r in rows) for c in range(len(head))]

    def line(cells: list[str]) -> str:
        padded = (" " * (w - cell_len(cell)) + cell if c in right else cell + " " * (w - cell_len(cell))
                  for c, (cell, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * w for w in widths)
    body = [line(r) for r in rows[1:-1]]
    console.out("\n".join([f"(a plain table: more than {RICH_ROWS:,} layers)", line(head), rule, *body, rule,
                           line(foot)]), highlight=False)


def _rich_table(plan: Plan, t: dict[str, Any], prefetch: bool, mixed: bool, console: Any) -> None:
    from rich.table import Table

    table = Table(show_footer=True, header_style="bold", footer_style="bold")
    table.add_column("#", justify="right", footer="", no_wrap=True)
    table.add_column("layer", footer="total", no_wrap=True)
    table.add_column("resident", justify="right", footer=format_bytes(t["resident_bytes"]), no_wrap=True)
    table.add_column("offloaded", justify="right", footer=format_bytes(t["offloaded_bytes"]), no_wrap=True)
    table.add_column("offloaded params", overflow="fold", ratio=1)
    if prefetch:
        table.add_column("slot", justify="right", no_wrap=True)
        table.add_column("copy before", overflow="fold")
    for row in layer_rows(plan):
        table.add_row(*_cells(row, prefetch, mixed), style=None if row["offloaded"] else "dim")
    console.print(table)


def _summary_lines(plan: Plan, t: dict[str, Any], console: Any, predictions: Predictions | None) -> None:
    s = plan.summary
    budget = format_bytes(s.gpu_budget_bytes) if s.gpu_budget_bytes is not None else "none"
    console.print(
        f"{t['layers']} layers, {t['offloaded_layers']} offloaded; peak GPU {format_bytes(s.peak_gpu_bytes)} "
        f"({peak_parts(plan)}) of budget {budget}; pinned host {format_bytes(s.pinned_host_bytes)}",
        highlight=False, markup=False,
    )
    for line in memory_lines(plan):
        console.print(line, highlight=False, markup=False)
    for note in s.notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    preds = predictions or plan.predictions
    if preds is not None:
        render_predictions(preds, console)
