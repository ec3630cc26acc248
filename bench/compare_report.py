"""bench_compare.py's JSONL as markdown tables and a chart.

    python bench/compare_report.py compare.jsonl [more.jsonl ...] --md compare.md --png docs/compare-h200.png

Several JSONL files (one comparison split over several runs, e.g. ``--only moe`` after a run whose time
budget ran out) are merged in order: a measured row replaces the same row (model, contender, workload,
mode) of an earlier file, a skipped one never replaces a measured one.

Tables: per model, every contender on every workload (step time; for a plan of ours its predicted step
and the step over it; the step over the link bound, over its own plan's bound (max(floor, the bytes the plan
offloads / link): the runtime against its own plan) and over the floor; peak GPU memory, host memory added,
outputs equal to the floor's); then the attempts of ``auto`` matched to another contender's memory, and the
diffusers sweep.
Chart: per model, grouped bars per workload (log scale), the link bound drawn across each group.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path



def workload_label(workload: str, case: dict) -> str:
    """"decode b=32", "prefill 2,048": from the tokens the run recorded for the workload."""
    tokens = case.get("tokens", {}).get(workload)
    if tokens is None:
        return workload
    return f"prefill {tokens:,}" if workload.startswith("prefill") else f"decode b={tokens}"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def merge(runs: list[list[dict]]) -> list[dict]:
    """The records of several runs as one: the first run's env and case records (per model), every error and
    profile, and per row key the last measured row (or the last row, when none was measured)."""
    out: list[dict] = []
    cases: set = set()
    rows: dict[tuple, dict] = {}
    for records in runs:
        for r in records:
            kind = r.get("type")
            if kind == "row":
                key = (r["model"], r["contender"], r["workload"], r.get("mode", "eager"), bool(r.get("sweep")))
                old = rows.get(key)
                if old is None or r["status"] == "ok" or old["status"] != "ok":
                    rows[key] = r
            elif kind == "case":
                if r["model"] not in cases:
                    cases.add(r["model"])
                    out.append(r)
            elif kind == "env":
                if not any(o.get("type") == "env" for o in out):
                    out.append(r)
            else:
                out.append(r)
    return out + list(rows.values())


def label(row: dict) -> str:
    return row["contender"] + ("" if row.get("mode", "eager") == "eager" else f" [{row['mode']}]")


def main_rows(records: list[dict]) -> list[dict]:
    """The rows of the main table: every measurement except the diffusers sweep's own lines and the attempts
    of a memory match (its reported row is in the table)."""
    return [r for r in records if r.get("type") == "row" and not r.get("sweep") and not r.get("attempt_of")]


def _gb(n) -> str:
    return "" if n is None else f"{n / 1e9:.2f}"


def _ms(x) -> str:
    return "" if x is None else (f"{x:,.1f}" if x >= 10 else f"{x:.2f}")


def _x(x) -> str:
    return "" if x is None else f"{x:.2f}x"


def _equal(row: dict) -> str:
    if row.get("equal") is None:
        return ""
    diff = row.get("max_abs_diff")
    return "yes" if row["equal"] else f"no ({diff:.3g})" if diff is not None else "no"


def _over(ms, by) -> str:
    """``ms / by`` as a ratio cell (blank when either is missing)."""
    return _x(ms / by) if ms is not None and by else ""


def _note(row: dict) -> str:
    """Why a row is not measured, how a memory match went, a raised budget, or few timed steps."""
    if row["status"] != "ok":
        return _status(row)
    if "target_peak_gpu_bytes" in row:
        target = _gb(row["target_peak_gpu_bytes"])
        if not row.get("within_target"):
            return f"over the target peak {target} GB in every attempt"
        return f"attempt {row['chosen_attempt']} of {len(row['attempts'])}, target peak {target} GB"
    if row.get("budget_raised_to"):
        return f"budget raised to {_gb(row['budget_raised_to'])} GB"
    if len(row.get("times_ms", [])) < 3:
        return f"{row['warmups']} warm-up, {len(row['times_ms'])} timed"
    return ""


def _status(row: dict) -> str:
    if row["status"] == "ok":
        return ""
    return f"{row['status']}: {row.get('error') or row.get('reason') or ''}"[:120].replace("|", "/")


def table(records: list[dict]) -> str:
    """The markdown tables (one per model, then the diffusers sweep)."""
    cases = {r["model"]: r for r in records if r.get("type") == "case"}
    rows = main_rows(records)
    out: list[str] = []
    for model in dict.fromkeys(r["model"] for r in rows):
        case = cases.get(model, {})
        out.append(f"### {model}: {_gb(case.get('total_bytes'))} GB of weights, budget {_gb(case.get('budget'))} GB, "
                   f"pinned host-to-GPU {case.get('h2d_gbps') and round(case['h2d_gbps'], 1)} GB/s\n")
        out.append("| workload | contender | step ms | pred ms | / pred | / link bound | / own bytes | / floor "
                   "| peak GPU GB | host added GB | equal to floor | note |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        mine = [r for r in rows if r["model"] == model]
        for w in dict.fromkeys(r["workload"] for r in mine):
            bound = case.get("link_bound_ms", {}).get(w)
            if bound:
                out.append(f"| {workload_label(w, case)} | **link bound** | {_ms(bound)} | | | 1.00x | | | | | | "
                           f"max(floor, {_gb(case.get('must_move_bytes'))} GB / link) |")
            ranked = sorted((r for r in mine if r["workload"] == w),
                            key=lambda r: (r["status"] != "ok", r.get("step_ms") or 0.0))
            for r in ranked:
                out.append(f"| {workload_label(w, case)} | {label(r)} | {_ms(r.get('step_ms'))} | "
                           f"{_ms(r.get('predicted_ms'))} | {_over(r.get('step_ms'), r.get('predicted_ms'))} | "
                           f"{_x(r.get('ratio_link'))} | {_x(r.get('ratio_own'))} | {_x(r.get('ratio_floor'))} | "
                           f"{_gb(r.get('peak_gpu_bytes'))} | {_gb(r.get('host_added_bytes'))} | {_equal(r)} | "
                           f"{_note(r)} |")
        out.append("")
    out += attempts_table(rows)
    sweep = [r for r in records if r.get("type") == "row" and r.get("sweep")]
    if sweep:
        out.append("### diffusers group offloading, configurations (decode b=1)\n")
        out.append("| model | configuration | step ms | peak GPU GB | host added GB | equal to floor | note |")
        out.append("|---|---|---:|---:|---:|---|---|")
        for r in sorted(sweep, key=lambda r: (r["model"], r["status"] != "ok", r.get("step_ms") or 0.0)):
            out.append(f"| {r['model']} | {r.get('diffusers_config', r['contender'])} | {_ms(r.get('step_ms'))} | "
                       f"{_gb(r.get('peak_gpu_bytes'))} | {_gb(r.get('host_added_bytes'))} | {_equal(r)} | "
                       f"{_status(r)} |")
        out.append("")
    failed = [r for r in records if r.get("type") == "error"]
    if failed:
        out.append("### sections that failed\n")
        out += [f"- {r['model']}, {r['section']}: {r['error']}" for r in failed]
        out.append("")
    return "\n".join(out)


def attempts_table(rows: list[dict]) -> list[str]:
    """Lines of the table of memory-match attempts (none when no row was matched to another's memory)."""
    matched = [r for r in rows if r.get("attempts")]
    if not matched:
        return []
    out = ["### `auto` at another contender's GPU memory: the attempts\n",
           "| model | workload | contender | attempt | budget GB | peak GPU GB | target GB | step ms | pred ms | note |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in matched:
        for a in r["attempts"]:
            if a["attempt"] == r.get("chosen_attempt"):
                note = "reported" if r.get("within_target") else "reported, over the target"
            else:
                note = a.get("reason") or ("over the target" if (a.get("peak_gpu_bytes") or 0)
                                           > r["target_peak_gpu_bytes"] else "slower")
            budget = _gb(a["budget"]) + (f" (raised to {_gb(a['budget_raised_to'])})" if a.get("budget_raised_to")
                                         else "")
            out.append(f"| {r['model']} | {r['workload']} | {r['contender']} | {a['attempt']} | {budget} | "
                       f"{_gb(a.get('peak_gpu_bytes'))} | {_gb(r['target_peak_gpu_bytes'])} | {_ms(a.get('step_ms'))} | "
                       f"{_ms(a.get('predicted_ms'))} | {str(note)[:120].replace('|', '/')} |")
    out.append("")
    return out


def chart(records: list[dict]):
    """The figure: one panel per model, bars per workload and contender, link bound lines (log y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    cases = {r["model"]: r for r in records if r.get("type") == "case"}
    ok = [r for r in main_rows(records) if r["status"] == "ok" and r.get("step_ms")]
    models = list(dict.fromkeys(r["model"] for r in ok))
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(7.5 * max(1, len(models)), 7), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in ok if r["model"] == model]
        workloads = list(dict.fromkeys(r["workload"] for r in mine))
        contenders = list(dict.fromkeys(label(r) for r in mine))
        width = 0.8 / max(1, len(contenders))
        colors = _colors(plt, [next(r["family"] for r in mine if label(r) == name) for name in contenders])
        for i, name in enumerate(contenders):
            xs, ys = [], []
            for j, w in enumerate(workloads):
                hit = [r for r in mine if r["workload"] == w and label(r) == name]
                if hit:
                    xs.append(j - 0.4 + width * (i + 0.5))
                    ys.append(hit[0]["step_ms"])
            ax.bar(xs, ys, width=width, color=colors[i], label=name)
        bounds = cases.get(model, {}).get("link_bound_ms", {})
        for j, w in enumerate(workloads):
            if bounds.get(w):
                ax.hlines(bounds[w], j - 0.45, j + 0.45, colors="black", linestyles="--", linewidth=1.5,
                          label="link bound" if j == 0 else None)
        ax.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        case = cases.get(model, {})
        ax.set_xticks(range(len(workloads)), [workload_label(w, case) for w in workloads])
        ax.set_ylabel("step time, ms (log)")
        ax.set_title(f"{model}: {_gb(case.get('total_bytes'))} GB, budget {_gb(case.get('budget'))} GB")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, frameon=False)
    fig.tight_layout()
    return fig


FAMILY_COLORMAPS = {"floor": "Greys", "ours": "Blues", "naive": "Purples", "accelerate": "Greens",
                    "diffusers": "Oranges"}


def _colors(plt, families: list[str]) -> list:
    """One color a contender: a shade of its family's color map (ours blue, accelerate green, ...)."""
    out = []
    for i, family in enumerate(families):
        same = [j for j, f in enumerate(families) if f == family]
        rank = same.index(i)
        cmap = plt.get_cmap(FAMILY_COLORMAPS.get(family, "Greys"))
        out.append(cmap(0.85 - 0.5 * rank / max(1, len(same) - 1) if len(same) > 1 else 0.7))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jsonl", type=Path, nargs="+", help="one run's JSONL, or several runs' to merge in order")
    ap.add_argument("--md", type=Path, help="write the tables here (default: print them)")
    ap.add_argument("--png", type=Path, help="write the chart here")
    args = ap.parse_args(argv)
    runs = []
    for path in args.jsonl:
        try:
            runs.append(load(path))
        except (OSError, json.JSONDecodeError) as err:
            print(f"error: {path}: {err}", file=sys.stderr)
            return 2
    records = merge(runs)
    text = table(records)
    if args.md:
        args.md.write_text(text + "\n")
    else:
        print(text)
    if args.png:
        chart(records).savefig(args.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
