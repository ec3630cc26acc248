"""Caps on what a spec may describe, checked before its layers are expanded.

A spec of a few lines can ask for ``repeat: 10000000`` or a tensor of 10^55 bytes; expanding
that would take minutes and gigabytes before anything could be said about it. These caps
are far above any real model (the benchmarks plan 10,000 layers of 20 params each) and keep
validation and planning fast; the counts are computed from ``repeat`` times the entry's
params, without expanding. docs/DESIGN.md, "Limits", lists them.
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.sizes import format_bytes
from schemas.spec_layers import LayerSpec, Tensor

MAX_LAYERS = 100_000  # layers after expansion
MAX_PARAMS = 2_000_000  # params, buffers and tied names after expansion
MAX_MODEL_BYTES = 2**50  # 1 PiB: the bytes of one tensor, and of all tensors together
MAX_BYTES_TEXT = "1 PiB (2^50 bytes)"


def _times(spec: LayerSpec) -> int:
    return spec.repeat or 1


def _largest(layers: Sequence[LayerSpec], weight: Sequence[int], params: bool) -> str:
    pos = max(range(len(layers)), key=weight.__getitem__)
    spec = layers[pos]
    parts = [f"{len(spec.params) + len(spec.tied):,} params"] if params else []
    if spec.repeat:
        parts.append(f"repeat {spec.repeat:,}")
    detail = f" ({' x '.join(parts)})" if parts else ""
    return f"the largest entry is layers[{pos}] {spec.name!r}{detail}"


def check_counts(layers: Sequence[LayerSpec]) -> None:
    """Refuse a spec that expands to more than MAX_LAYERS layers or MAX_PARAMS params (ValueError)."""
    per_entry = [_times(spec) for spec in layers]
    total = sum(per_entry)
    if total > MAX_LAYERS:
        raise ValueError(f"the model expands to {total:,} layers, more than the {MAX_LAYERS:,} supported; "
                         f"{_largest(layers, per_entry, False)}")
    per_entry = [_times(spec) * (len(spec.params) + len(spec.tied)) for spec in layers]
    total = sum(per_entry)
    if total > MAX_PARAMS:
        raise ValueError(f"the model expands to {total:,} params and tied names, more than the "
                         f"{MAX_PARAMS:,} supported; {_largest(layers, per_entry, True)}")


def _amount(n: int) -> str:
    return format_bytes(n) if n < 2**70 else f"about 2^{n.bit_length() - 1} bytes"


def check_bytes(layers: Sequence[LayerSpec], tensors: Sequence[Sequence[Tensor]]) -> None:
    """Refuse a tensor, or a model, of more than MAX_MODEL_BYTES (ValueError naming the entry)."""
    per_entry = []
    sums: dict[int, int] = {}  # id(entry) -> its bytes: entries listing the same params share one tuple
    for pos, (spec, entry) in enumerate(zip(layers, tensors)):
        total = sums.get(id(entry))
        if total is None:
            for t in entry:
                if t.nbytes > MAX_MODEL_BYTES:
                    raise ValueError(f"layers[{pos}] {spec.name!r}: param {t.name!r} takes {_amount(t.nbytes)} "
                                     f"({t.dtype}), more than the {MAX_BYTES_TEXT} a tensor may take")
            total = sums[id(entry)] = sum(t.nbytes for t in entry)
        per_entry.append(_times(spec) * total)
    total = sum(per_entry)
    if total > MAX_MODEL_BYTES:
        pos = max(range(len(layers)), key=per_entry.__getitem__)
        raise ValueError(f"the model's params and buffers take {_amount(total)}, more than the "
                         f"{MAX_BYTES_TEXT} supported; the largest entry is layers[{pos}] {layers[pos].name!r} "
                         f"({_amount(per_entry[pos])})")
