"""`planner show --chart FILE`: a plan's memory per layer and one predicted forward, drawn.

Top panel: bytes per layer, stacked (resident on the GPU, offloaded to host memory), and
the buffer pool as a line. Bottom panel: one forward as ``planner.cost.timeline`` predicts it,
on three rows: the CPU issuing each layer's kernels (a line with a tick per layer), the
compute stream (a bar per layer, purple when its weights are offloaded, a red bar where it waits for a copy), the copy stream (a
bar per prefetched layer's copy; hatched when it fills a slot for the next forward).
A stall is the red in the middle row. matplotlib is an optional extra, imported here only,
drawing on the Agg canvas (no display needed).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

from schemas.errors import InputError
from schemas.expert_graphs import graphs_on
from schemas.hardware_profile import HardwareProfile
from schemas.plan import Plan
from schemas.sizes import format_bytes

from planner.cost.layer import layers_work
from planner.cost.predict import plan_sequences, timeline

SUFFIXES = (".png", ".svg", ".pdf")
_UNITS = (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1))
_ROWS = {"copy": 0, "compute": 1, "cpu": 2}
_COLORS = {"resident": "#4C72B0", "offloaded": "#DD8452", "pool": "#55A868", "compute": "#4C72B0",
           "offloaded_layer": "#8172B3", "copy": "#DD8452", "stall": "#C44E52", "cpu": "#333333"}


@dataclass
class Chart:
    """The figure and what was drawn on it, by meaning (for a reader or a test to inspect)."""

    figure: Any
    resident: Any  # BarContainer: one bar per layer
    offloaded: Any  # BarContainer: one bar per layer, stacked on resident
    compute: Any  # BarContainer: one bar per layer
    copy: Any  # BarContainer: one bar per copy issued in the forward
    stall: Any  # BarContainer: one bar per layer that waits for its copy
    cpu: Any  # Line2D: the CPU's issue clock, a tick at the end of each layer


def check_chart_path(path: str | Path) -> Path:
    """The chart's file, if its suffix names a format we draw (.png, .svg, .pdf)."""
    p = Path(path)
    if p.suffix.lower() not in SUFFIXES:
        got = f"'{p.suffix}'" if p.suffix else "no suffix"
        raise InputError(f"--chart {path}: the file name has {got}; expected one of {', '.join(SUFFIXES)}")
    return p


def _figure_class() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError("--chart needs matplotlib, which is not installed: "
                         "pip install 'offload-planner[chart]'") from None

    def make(**kwargs: Any) -> Any:
        fig = Figure(**kwargs)
        FigureCanvasAgg(fig)
        return fig

    return make


def _unit(largest: float) -> tuple[str, int]:
    return next(((u, s) for u, s in _UNITS if largest >= s), _UNITS[-1])


def _memory_panel(ax: Any, plan: Plan) -> tuple[Any, Any]:
    n = len(plan.layers)
    pool = plan.buffer_pool.bytes if plan.buffer_pool is not None else 0
    unit, scale = _unit(max([pool] + [layer.resident_bytes + layer.offloaded_bytes for layer in plan.layers]))
    xs = list(range(n))
    resident = [layer.resident_bytes / scale for layer in plan.layers]
    offloaded = [layer.offloaded_bytes / scale for layer in plan.layers]
    res = ax.bar(xs, resident, color=_COLORS["resident"], label="resident on GPU")
    off = ax.bar(xs, offloaded, bottom=resident, color=_COLORS["offloaded"], label="offloaded to host")
    if pool:
        slots = plan.buffer_pool.slots
        spanning = [layer.name for layer in plan.layers if layer.prefetch is not None and layer.prefetch.span]
        over = f", {', '.join(spanning)} over them" if spanning else ""
        ax.axhline(pool / scale, color=_COLORS["pool"], linestyle="--",
                   label=f"buffer pool on GPU ({slots} slot{'s' * (slots != 1)}{over})")
    ax.set_ylabel(f"bytes ({unit})")
    ax.set_xlim(-0.6, n - 0.4)
    if n <= 40:
        ax.set_xticks(xs, [layer.name for layer in plan.layers], rotation=90, fontsize=7)
    else:
        ax.set_xlabel("layer (execution order)")
    ax.legend(loc="upper center", fontsize=8)
    s = plan.summary
    ax.set_title(f"{s.model}: backend {s.backend}, {s.offloaded_layers} of {s.layers} layers offloaded, "
                 f"peak GPU {format_bytes(s.peak_gpu_bytes)}, pinned host {format_bytes(s.pinned_host_bytes)}",
                 fontsize=10)
    return res, off


def _timeline_panel(ax: Any, plan: Plan, hw: HardwareProfile, name: str, tokens: int) -> tuple[Any, ...]:
    t = timeline(plan, hw, tokens, plan_sequences(plan, name, tokens))
    issued = layers_work(plan.layers, tokens, hw, graphs=graphs_on(plan.memory))
    cpu_ends = list(accumulate(w.cpu_ms for w in issued))
    y = _ROWS
    colors = [_COLORS["offloaded_layer"] if layer.offloaded else _COLORS["compute"] for layer in plan.layers]
    compute = ax.barh([y["compute"]] * len(t.layers), [lt.end - lt.start for lt in t.layers],
                      left=[lt.start for lt in t.layers], height=0.6, color=colors, edgecolor="white",
                      linewidth=0.5)
    stalled = [lt for lt in t.layers if lt.stall > 0]
    stall = ax.barh([y["compute"]] * len(stalled), [lt.stall for lt in stalled],
                    left=[lt.start - lt.stall for lt in stalled], height=0.6, color=_COLORS["stall"])
    copied = [(lt, layer) for lt, layer in zip(t.layers, plan.layers) if lt.copy_start is not None]
    copy = ax.barh([y["copy"]] * len(copied), [lt.copy_end - lt.copy_start for lt, _ in copied],
                   left=[lt.copy_start for lt, _ in copied], height=0.6, color=_COLORS["copy"],
                   edgecolor="white", linewidth=0.5)
    for bar, (_, layer) in zip(copy.patches, copied):
        if layer.prefetch.previous_forward:
            bar.set_hatch("//")
    (cpu,) = ax.plot([0.0] + cpu_ends, [y["cpu"]] * (len(cpu_ends) + 1), color=_COLORS["cpu"], marker="|",
                     markersize=8, label="CPU issues each layer's kernels")
    ax.axvline(t.step_ms, color="black", linewidth=0.8, linestyle=":")
    ax.set_yticks([y["copy"], y["compute"], y["cpu"]], ["copy stream", "compute stream", "CPU"])
    ax.set_ylim(-0.7, 2.7)
    ax.set_xlim(0, t.step_ms * 1.02 if t.step_ms > 0 else 1)
    ax.set_xlabel("ms from the start of the forward")
    ax.set_title(f"predicted forward, {name} ({tokens} token{'s' * (tokens != 1)}) on {hw.name}: "
                 f"step {t.step_ms:.3f} ms, bound by {t.bound}; stalls {t.stall_ms:.3f} ms, "
                 f"copies {t.copy_ms:.3f} ms, compute {t.compute_ms:.3f} ms, CPU {t.cpu_ms:.3f} ms",
                 fontsize=10)
    ax.legend(handles=_legend(bool(stalled), bool(copied), cpu), loc="upper right", fontsize=8)
    return compute, copy, stall, cpu


def _legend(stalls: bool, copies: bool, cpu: Any) -> list[Any]:
    from matplotlib.patches import Patch

    out = [cpu, Patch(color=_COLORS["compute"], label="layer computing"),
           Patch(color=_COLORS["offloaded_layer"], label="layer with offloaded weights computing")]
    if stalls:
        out.append(Patch(color=_COLORS["stall"], label="stall: waiting for its copy"))
    if copies:
        out += [Patch(color=_COLORS["copy"], label="copy host -> GPU"),
                Patch(facecolor=_COLORS["copy"], hatch="//", edgecolor="white", label="copy for the next forward")]
    return out


def chart(plan: Plan, hw: HardwareProfile, name: str, tokens: int) -> Chart:
    """Draw the plan's memory and its predicted forward for workload ``name`` at ``tokens``."""
    fig = _figure_class()(figsize=(13, 8), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[3, 2])
    resident, offloaded = _memory_panel(top, plan)
    compute, copy, stall, cpu = _timeline_panel(bottom, plan, hw, name, tokens)
    return Chart(fig, resident, offloaded, compute, copy, stall, cpu)


def render(drawn: Chart, suffix: str) -> bytes:
    """The figure as the bytes of a .png, .svg or .pdf file."""
    out = io.BytesIO()
    drawn.figure.savefig(out, format=suffix.lstrip(".").lower(), dpi=120)
    return out.getvalue()
