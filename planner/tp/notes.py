"""The words of tensor-parallel planning (planner/tp/ranks.py and planner/tp/split.py decide): the notes every rank
plan carries and the lines that sum up a rank set. No rank number appears in a note, so that the plans of a
set differ only in ``summary.rank``."""

from __future__ import annotations

from schemas.shard import SHARDS
from schemas.sizes import format_bytes

from planner.words.names import join_names

SHARD_WORDS = {"dim0": "by output features (dim0)", "dim1": "by input features (dim1)",
               "vocab": "by vocabulary", "experts": "by expert",
               "kv_head": "by KV head (each rank one whole KV head, shared with the ranks of its group)"}
UNMATCHED_SHOWN = 5


def split_note(world_size: int, model_bytes: int, rank_bytes: int, by_shard: dict[str, int]) -> str:
    """How the model is cut: what each rank holds, split how, and what every rank holds whole."""
    parts = [f"{format_bytes(by_shard[s])} {SHARD_WORDS[s]}" for s in SHARDS if s in SHARD_WORDS and by_shard.get(s)]
    split = "; ".join(parts) if parts else "nothing"
    return (f"tensor parallel over {world_size} ranks: each rank holds {format_bytes(rank_bytes)} of the model's "
            f"{format_bytes(model_bytes)} (split {world_size} ways: {split}; replicated on every rank: "
            f"{format_bytes(by_shard.get('replicated', 0))}); shapes, bytes and budgets in this plan are one rank's")


def unmatched_note(unmatched: dict[str, int]) -> str:
    """Params no default rule splits, so they stay whole on every rank."""
    total = sum(unmatched.values())
    names = join_names(unmatched, limit=UNMATCHED_SHOWN)
    return (f"{len(unmatched)} param(s) ({format_bytes(total)} in all their layers) match no shard rule and stay "
            f"replicated on every rank by default: {names}; give them shard: in the spec to split them")


def by_rows_note(params: list[str]) -> str:
    """Attention params split by rows while the spec gives no heads: right only if the ranks divide the heads."""
    return (f"{len(params)} attention param(s) split by rows without the model's heads ({join_names(params, limit=3)}): "
            "right when the world size divides the KV heads; engines give each rank one whole KV head when there are "
            "more ranks than KV heads, and refuse a world size the heads do not allow: add model.attention: "
            "{heads: H, kv_heads: K} to plan by heads")


def collectives_note(row_parallel_layers: int, vocab: bool) -> str:
    """What the predicted step leaves out: the collectives tensor parallelism adds to a forward."""
    what = []
    if row_parallel_layers:
        what.append(f"the all-reduce after each of the {row_parallel_layers} layers with row-parallel (dim1) params")
    if vocab:
        what.append("the collectives of the vocabulary-split embedding and LM head")
    without = f", without {' or '.join(what)}" if what else ""
    return ("collectives are not modelled (the hardware profile has no collective figure): the predicted step "
            f"is this rank's own compute and copies{without}")


def set_lines(plans: list, slowest: int | None) -> list[str]:
    """One line a rank (peak GPU, pinned host, predicted step) and which rank sets the step."""
    out = []
    for plan in plans:
        s = plan.summary
        step = f", predicted step {plan.predictions.weighted_step_ms:.3f} ms" if plan.predictions else ""
        out.append(f"rank {s.rank}: peak GPU {format_bytes(s.peak_gpu_bytes)}, offloaded "
                   f"{format_bytes(s.offloaded_bytes)} in {s.offloaded_layers} layers, pinned host "
                   f"{format_bytes(s.pinned_host_bytes)}{step}")
    if slowest is not None:
        out.append(slowest_line(slowest, plans[slowest].predictions.weighted_step_ms))
    return out


def slowest_line(rank: int, step_ms: float) -> str:
    return f"the slowest rank sets the step: rank {rank}, {step_ms:.3f} ms predicted (collectives not modelled)"


def world_change(old: int, new: int, markdown: bool) -> str:
    text = f"world size {old} -> {new}: every split param changes shape; ranks compared: 0..{min(old, new) - 1}"
    return f"**{text.replace('->', '→')}**" if markdown else text
