"""The routed experts' arithmetic over a subset of a layer's experts, as transformers' experts modules do it.

Transformers 5 holds a layer's routed experts in one module (``Qwen3MoeExperts``, ``MixtralExperts``,
``OlmoeExperts``...) whose params are 3-D, expert first: ``gate_up_proj [E, 2I, H]`` (``up_proj`` without
a gate), ``down_proj [E, H, I]`` (``[E, in, out]`` when the class says ``is_transposed``), optional
``*_bias [E, out]``; its forward takes ``(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])``.
Its flags (``has_gate``, ``has_bias``, ``is_transposed``, ``has_post_expert_norm``) and its ``_apply_gate``
/ ``act_fn`` / ``post_expert_norm`` are read from the module, so the arithmetic is the model's own.

A *part* is some of the experts with their slices of those params (``[n, ...]``, part-local numbering).
``part_rows`` computes a part's contribution to every (token, choice) pair: the pair's weighted expert
output when its expert is in the part, zero otherwise. Parts of one layer are disjoint, so adding their
rows is exact, and the sum over a token's k choices is then taken once, as transformers' grouped kernel
does (``rows.view(T, k, H).sum(1)``).

``part_rows`` is written for the GPU: no value is read back (pairs outside the part sort to the end and
the grouped matmul stops at the last offset), so it can be captured in a CUDA graph. ``host_rows`` is the
host CPU's version: it compacts the pairs first (data-dependent shapes cost nothing there) and runs the padded
pass over the touched experts, each projection through runtime/host_matmul.py's kernel where it is built (bf16,
at most ``host_matmul.MAX_PASSES`` passes of 4 rows a touched expert on average, no gradient), else one torch.bmm
a projection and batch of experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import runtime.host_matmul as host_matmul
from schemas.grouped_tiles import padded_rows


HOST_IN_OUT: frozenset[str] = frozenset()
"""The per-expert weights the host stores [E, in, out]; the others it stores [E, out, in]. oneDNN's batched kernel
(brgemm on AMX, torch.bmm's bf16 path on the H200's host) read 64 Qwen3-MoE experts' gate and up projections stored
[out, in] about twice as fast as stored [in, out] at the rows a decode step gives an expert (57 against 27 GB/s at 2
rows, 49-60 against 32 in a second run); for the down projections the two runs disagreed (the [out, in] order faster
at 4 and 8 rows, slower at 2), and a whole forward did not tell the two apart (bench/probe_host_rows_m.py,
bench_moe_hybrid.py ``--host-in-out``, 2026-12-03). Until then the host stored its down weights [in, out]; the knob
stays for measuring the two side by side."""


@dataclass(frozen=True)
class Layout:
    """What an experts module's params are and how its forward combines them."""

    up: str  # gate_up_proj, or up_proj without a gate
    has_gate: bool
    has_bias: bool
    up_t: bool  # the up weight is [E, in, out] instead of [E, out, in]
    down_t: bool  # the down weight likewise
    post_norm: bool

    @classmethod
    def of(cls, module: nn.Module) -> Layout:
        has_gate = bool(getattr(module, "has_gate", True))
        transposed = bool(getattr(module, "is_transposed", False))
        return cls("gate_up_proj" if has_gate else "up_proj", has_gate, bool(getattr(module, "has_bias", False)),
                   transposed, transposed, bool(getattr(module, "has_post_expert_norm", False)))

    def for_host(self) -> Layout:
        """The layout the host keeps its experts in: each weight [E, out, in] (nn.Linear's order) but those named in
        ``HOST_IN_OUT``."""
        return Layout(self.up, self.has_gate, self.has_bias, self.up in HOST_IN_OUT, "down_proj" in HOST_IN_OUT,
                      self.post_norm)

    def flipped(self, other: Layout) -> set[str]:
        """The weights stored transposed in ``other`` relative to this layout."""
        return {name for name, mine, theirs in ((self.up, self.up_t, other.up_t),
                                                ("down_proj", self.down_t, other.down_t)) if mine != theirs}

    @property
    def names(self) -> tuple[str, ...]:
        """The module's per-expert tensors this arithmetic reads."""
        base = (self.up, "down_proj")
        return base + tuple(f"{n}_bias" for n in base) if self.has_bias else base


EXPERTS_FORWARD = ["hidden_states", "top_k_index", "top_k_weights"]


def is_experts_module(module: nn.Module) -> bool:
    """Whether ``module``'s forward takes (hidden_states, top_k_index, top_k_weights), as transformers 5's experts
    modules do."""
    import inspect

    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return False
    return names[:3] == EXPERTS_FORWARD


# rows an expert sees from which one matmul per expert beats torch's grouped kernel on the host CPU (the H200's
# host: 2,048 tokens 153 ms against 298 ms a layer, 32 tokens 62 ms against 33 ms; bench/probe_cpu_experts.py)
HOST_LOOP_ROWS = 16


def grouped(x: torch.Tensor, experts: int) -> bool:
    """Whether ``_linear`` uses torch's grouped matmul: on the GPU in bf16 (the kernel's dtype there), on the
    host while experts see few rows each."""
    if not hasattr(F, "grouped_mm"):
        return False
    if x.device.type == "cpu":
        return x.shape[0] < HOST_LOOP_ROWS * experts
    return x.dtype == torch.bfloat16


def _linear(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, transposed: bool) -> torch.Tensor:
    """Rows of ``x`` (sorted by expert, ``offs`` the end of each expert's rows) through their expert's
    weight; rows past ``offs[-1]`` are left undefined."""
    wt = w if transposed else w.transpose(-2, -1)
    if grouped(x, w.shape[0]):
        rows = x.shape[0]
        padded = padded_rows(rows, w.shape[0]) if x.device.type == "cuda" else rows
        if padded > rows:  # rows past the last group's end, not computed: the call takes the tall tiles
            xp = x.new_empty((padded, x.shape[1]))
            xp[:rows] = x
            return F.grouped_mm(xp, wt, offs=offs)[:rows]
        return F.grouped_mm(x, wt, offs=offs)
    out = x.new_zeros(x.shape[0], wt.shape[-1])  # one matmul per expert (on the GPU: reads the offsets back)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = x[start:end] @ wt[e]
        start = end
    return out


def expert_outputs(module: nn.Module, layout: Layout, weights: dict[str, torch.Tensor], x: torch.Tensor,
                   ids: torch.Tensor | None, offs: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` (sorted by expert, ``offs`` each expert's end) through its expert; ``ids``, each row's
    part-local expert clamped into the part, are read for the biases only."""
    a = _linear(x, weights[layout.up], offs, layout.up_t)
    if layout.has_bias:
        a = a + weights[f"{layout.up}_bias"][ids]
    a = module._apply_gate(a) if layout.has_gate else module.act_fn(a)
    o = _linear(a, weights["down_proj"], offs, layout.down_t)
    if layout.has_bias:
        o = o + weights["down_proj_bias"][ids]
    if layout.post_norm:
        o = module.post_expert_norm(o)
    return o


def part_rows(module: nn.Module, layout: Layout, weights: dict[str, torch.Tensor], table: torch.Tensor,
              hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """[T·k, H]: each pair's weighted output if its expert is in the part, else 0. ``table`` maps a global
    expert id to its part-local one, or to ``n`` (the part's size) when the part does not hold it."""
    return parts_rows(module, layout, [weights], table, hidden, top_k_index, top_k_weights)


def parts_rows(module: nn.Module, layout: Layout, parts: list[dict[str, torch.Tensor]], table: torch.Tensor,
               hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
               layouts: list[Layout] | None = None) -> torch.Tensor:
    """``part_rows`` of several parts of one layer at once (``layouts``: each part's, default ``layout``), the pairs
    sorted once (one sort, count, gather, weighting and scatter a layer however many parts: at batch 1 the CPU's
    launches are the step). ``table``
    maps a global expert id to its place in the parts taken in order (part 0's experts first), or to the parts'
    total when no part holds it (those pairs' rows are 0).

    Each part's grouped matmuls run over the sorted rows from the first: the rows before its own experts' (the
    earlier parts') go through its first expert and are not taken (``torch.where`` on the sorted ids), so put
    first the part whose weights cross the link, which then reads only the experts its own rows route to; the
    later parts' first experts see the earlier rows again from GPU memory. Rows past a part's last expert are
    undefined in its output and likewise not taken. A row's value is what ``part_rows`` of its own part gives it,
    but for the rows of a later part's first expert, whose group also holds the earlier rows: torch's CPU kernel
    can round those float32 rows otherwise (tests/test_parts_rows.py); on the H200 in bf16 the logits are the
    resident model's bit for bit (tests/test_cpu_experts_gpu.py)."""
    k = top_k_index.shape[-1]
    sizes = [next(iter(w.values())).shape[0] for w in parts]
    if not parts or not all(sizes):
        raise ValueError(f"parts_rows takes parts of one expert or more (sizes {sizes})")
    total = sum(sizes)
    local = table[top_k_index].reshape(-1)
    order = torch.argsort(local, stable=True)
    ids = local[order]
    # one bin an id; the pairs of no part (id ``total``) fall past the last bin, or, with one expert in all the
    # parts, in a second bin left out (histc over min == max would read the data's range back: a sync)
    bins = total if total > 1 else 2
    counts = torch.histc(ids.float() if ids.device.type == "cpu" else ids.int(), bins=bins, min=0, max=bins - 1)
    offs = torch.cumsum(counts[:total], 0, dtype=torch.int32)
    x = hidden[order // k]
    o = None
    start = 0
    for weights, n, part_layout in zip(parts, sizes, layouts or [layout] * len(parts)):
        own = (ids - start).clamp(0, n - 1) if layout.has_bias else None  # bias rows only
        xin = x
        if x.requires_grad:  # the grouped kernel's backward leaves rows past the part's last expert undefined
            xin = torch.where(((ids >= start) & (ids < start + n)).unsqueeze(-1), x, x.new_zeros(()))
        out = expert_outputs(module, part_layout, weights, xin, own, offs[start:start + n])
        if o is None:
            o = out
        else:  # in place where autograd need not see it (no third [T·k, H] held)
            later = (ids >= start).unsqueeze(-1)
            o = torch.where(later, out, o) if o.requires_grad or out.requires_grad else torch.where(later, out, o, out=o)
        del out
        start += n
    if total < table.numel():  # some experts are in no part (the host's): their rows are undefined, made 0 before
        o = torch.where((ids < total).unsqueeze(-1), o, o.new_zeros(()))  # the weighting (its backward reads them)
    o = o * top_k_weights.reshape(-1)[order].unsqueeze(-1)  # in the promoted dtype, as transformers weighs them
    rows = torch.empty_like(o)
    rows[order] = o
    return rows


def host_rows(module: nn.Module, layout: Layout, weights: dict[str, torch.Tensor], table: torch.Tensor,
              hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
              out: torch.Tensor, kernel: str = "padded") -> bool:
    """``part_rows`` on the host, into ``out`` ([T·k, H] of ``rows_dtype``, zeroed by the caller), over only the
    pairs routed to the part: the padded pass (``_padded_rows``), or torch's grouped kernel (``kernel="grouped"``,
    for measurements). False when no pair is routed to the part."""
    n = next(iter(weights.values())).shape[0]
    k = top_k_index.shape[-1]
    local = table[top_k_index].reshape(-1)
    pairs = torch.nonzero(local < n).squeeze(-1)
    if pairs.numel() == 0:
        return False
    ids, order = torch.sort(local[pairs], stable=True)
    pairs = pairs[order]
    if kernel == "padded":
        _padded_rows(module, layout, weights, ids, pairs, hidden, top_k_weights, n, k, out)
        return True
    offs = torch.cumsum(torch.bincount(ids, minlength=n), 0).to(torch.int32)
    o = expert_outputs(module, layout, weights, hidden[pairs // k], ids, offs)
    out[pairs] = o * top_k_weights.reshape(-1)[pairs].unsqueeze(-1)
    return True


JOIN_WASTE = 0.125
"""The padded pass joins runs of touched experts across the untouched ones between them while the untouched
experts a batch reads stay at most this share of its touched ones: fewer, longer batched matmuls for a few
experts' bytes read in vain (their rows are zeros and their outputs are not gathered, so the result is the
same bit for bit). 0 keeps every run apart."""


PAD_ROWS = 1
"""The padded pass pads each expert's rows up to a multiple of this (at least the most any touched expert sees):
1 pads to that most only. No multiple was faster at both 32 and 64 tokens on the H200's host
(bench/probe_host_rows_m.py, 2026-12-03), so it stays 1; the probe sets it."""


def _runs(counts: list[int], waste: float | None = None) -> list[tuple[int, int]]:
    """[start, end) of each batch of the padded pass: runs of consecutive experts that see rows, joined across
    gaps while a batch's untouched experts stay at most ``waste`` (default ``JOIN_WASTE``) of its touched ones."""
    waste = JOIN_WASTE if waste is None else waste
    batches: list[list[int]] = []  # [start, end, touched]
    start = None
    for e, c in enumerate([*counts, 0]):
        if c and start is None:
            start = e
        elif not c and start is not None:  # a run [start, e) ends: join it to the last batch or begin one
            last = batches[-1] if batches else None
            if last is not None and (e - last[0]) - (last[2] + e - start) <= waste * (last[2] + e - start):
                last[1], last[2] = e, last[2] + e - start
            else:
                batches.append([start, e, e - start])
            start = None
    return [(s, e) for s, e, _ in batches]


def _padded_rows(module: nn.Module, layout: Layout, weights: dict[str, torch.Tensor], ids: torch.Tensor,
                 pairs: torch.Tensor, hidden: torch.Tensor, top_k_weights: torch.Tensor, n: int, k: int,
                 out: torch.Tensor) -> None:
    """The padded pass: each touched expert's rows (``pairs`` sorted by part-local ``ids``) padded to the most any
    expert sees, every batch of ``_runs`` one batched matmul a projection (torch.bmm: oneDNN's batched kernel, the
    threads sharing the whole batch's weights), so each touched expert is read once and an untouched one only
    inside a short gap that ``JOIN_WASTE`` lets a batch span. Measured on the H200's host
    (bench/results/hybrid-h200-2026-12-01/): 48 experts at 32 tokens 7.6 ms against 9.9 for torch's grouped
    kernel and 9.0 for a dense pass of every token through every expert; at 64 tokens 8.2 against 12.0 and 13.1
    (runs not joined then). Joined (bench/probe_host_runs.py, 2026-12-02): 64 experts at 32 tokens 14.0 ms
    against 19.5 apart, at 64 tokens 9.8 against 12.8, at 8 tokens 8.4 against 9.7."""
    counts = torch.bincount(ids, minlength=n)
    rows = -(-int(counts.max()) // PAD_ROWS) * PAD_ROWS
    slot = torch.arange(ids.numel()) - (torch.cumsum(counts, 0) - counts)[ids]
    up, down = weights[layout.up], weights["down_proj"]
    passes = host_matmul.passes(counts)  # the kernel's passes a touched expert takes on average
    if host_matmul.usable(hidden, up, layout.up_t, passes) and host_matmul.usable(hidden, down, layout.down_t, passes):
        _kernel_rows(module, layout, weights, ids, pairs, hidden, top_k_weights, k, counts, rows, slot, out)
        return
    x = hidden.new_zeros(n, rows, hidden.shape[-1])
    x[ids, slot] = hidden[pairs // k]
    o = None
    for s, e in _runs(counts.tolist()):
        a = torch.bmm(x[s:e], up[s:e] if layout.up_t else up[s:e].transpose(-2, -1))
        if layout.has_bias:
            a = a + weights[f"{layout.up}_bias"][s:e].unsqueeze(1)
        a = module._apply_gate(a) if layout.has_gate else module.act_fn(a)
        r = torch.bmm(a, down[s:e] if layout.down_t else down[s:e].transpose(-2, -1))
        if layout.has_bias:
            r = r + weights["down_proj_bias"][s:e].unsqueeze(1)
        if o is None:
            o = r.new_empty(n, rows, r.shape[-1])
        o[s:e] = r
    _weighted(module, layout, o[ids, slot], pairs, top_k_weights, out)


def _kernel_rows(module: nn.Module, layout: Layout, weights: dict[str, torch.Tensor], ids: torch.Tensor,
                 pairs: torch.Tensor, hidden: torch.Tensor, top_k_weights: torch.Tensor, k: int, counts: torch.Tensor,
                 rows: int, slot: torch.Tensor, out: torch.Tensor) -> None:
    """The padded pass through ``runtime.host_matmul``'s kernel: the touched experts only, each weight read once for
    all of its expert's rows; the gate, biases and norm are the module's own, between the two projections, at the
    rounding points of the torch.bmm pass (each projection's sums rounded to bf16 once)."""
    touched = torch.nonzero(counts).squeeze(-1)
    dense = (torch.cumsum(counts > 0, 0) - 1)[ids]  # each pair's expert's place among the touched
    x = torch.zeros(touched.numel(), rows, hidden.shape[-1], dtype=torch.float32)
    x[dense, slot] = hidden[pairs // k].float()
    seen = counts[touched]
    a = host_matmul.grouped_rows(x, weights[layout.up], touched, seen)
    if layout.has_bias:
        a = a + weights[f"{layout.up}_bias"][touched].unsqueeze(1)
    a = module._apply_gate(a) if layout.has_gate else module.act_fn(a)
    r = host_matmul.grouped_rows(a, weights["down_proj"], touched, seen)
    if layout.has_bias:
        r = r + weights["down_proj_bias"][touched].unsqueeze(1)
    _weighted(module, layout, r[dense, slot], pairs, top_k_weights, out)


def _weighted(module: nn.Module, layout: Layout, o: torch.Tensor, pairs: torch.Tensor, top_k_weights: torch.Tensor,
              out: torch.Tensor) -> None:
    """The padded pass's last step, either way: each pair's expert output (``o``, in ``pairs``' order) through the
    module's post-expert norm, weighted by its routing weight into its row of ``out``."""
    if layout.post_norm:
        o = module.post_expert_norm(o)
    out[pairs] = o * top_k_weights.reshape(-1)[pairs].unsqueeze(-1)


def rows_dtype(hidden: torch.Tensor, top_k_weights: torch.Tensor) -> torch.dtype:
    """The dtype of the weighted rows: the experts' outputs (``hidden``'s dtype) times the routing weights."""
    return torch.promote_types(hidden.dtype, top_k_weights.dtype)


def join_rows(rows: torch.Tensor, tokens: int, dtype: torch.dtype) -> torch.Tensor:
    """[T, H]: each token's pairs summed (the parts' rows added first)."""
    return rows.view(tokens, -1, rows.shape[-1]).sum(dim=1).to(dtype)
