"""`planner export --to vllm` in words: the flags (text: one line for a shell), or the parts vLLM's
flags cannot express with the closest plan they can (text or JSON). Decided in planner/vllm/export.py."""

from __future__ import annotations

import json
import shlex

from schemas.sizes import format_bytes

from planner.vllm.export import Export


def render(result: Export, plan_name: str, fmt: str) -> str:
    return _json(result, plan_name) if fmt == "json" else _text(result, plan_name)


def _text(result: Export, plan_name: str) -> str:
    if result.flags is not None:
        return result.flags.text() + "\n"  # empty when nothing is offloaded: vLLM's defaults offload nothing
    lines = [f"{plan_name} cannot be written as vLLM flags:"]
    lines += [f"  - {p.part}: {p.detail}" for p in result.problems]
    c = result.closest
    if c is not None:
        ours = result.plan.predictions.weighted_step_ms if result.plan.predictions else None
        budget = (f"within the {format_bytes(c.target_bytes)} gpu_budget" if c.fits
                  else f"over the {format_bytes(c.target_bytes)} the plan fits (no vLLM flags of this family fit)")
        versus = f" (this plan: {ours:.3f} ms, x{c.weighted_step_ms / ours:.2f})" if ours else ""
        lines += [f"closest expressible plan: {c.flags.text()}",
                  f"  peak {format_bytes(c.peak_gpu_bytes)} {budget}; predicted step "
                  f"{c.weighted_step_ms:.3f} ms{versus}",
                  f"  see it: planner plan SPEC --from-vllm {shlex.quote(c.flags.text())}"]
    return "\n".join(lines) + "\n"


def _json(result: Export, plan_name: str) -> str:
    out: dict = {"plan": plan_name, "expressible": result.flags is not None}
    if result.flags is not None:
        out |= {"flags": result.flags.words(), "command_line": result.flags.text()}
    else:
        out["problems"] = [{"part": p.part, "detail": p.detail} for p in result.problems]
        c = result.closest
        out["closest"] = None if c is None else {
            "flags": c.flags.words(), "command_line": c.flags.text(), "peak_gpu_bytes": c.peak_gpu_bytes,
            "target_gpu_bytes": c.target_bytes, "fits": c.fits, "weighted_step_ms": c.weighted_step_ms,
            "plan_weighted_step_ms": result.plan.predictions.weighted_step_ms if result.plan.predictions else None}
    return json.dumps(out, indent=2) + "\n"
