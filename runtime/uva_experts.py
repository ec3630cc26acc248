"""Layers whose routed experts are read through UVA: their prefill-sized calls in tall tiles.

A layer whose experts module reads any of its tensors through UVA (and whose experts are not split by expert:
runtime/cpu_experts.py has its own forward for those) runs transformers' experts module as it is, but for the
calls that torch's grouped matmul would cut into short tiles while tall ones are within reach
(schemas/grouped_tiles.py: more than 64 and at most 128 rows an expert on average; a 2,048-token prefill at top-8
of 128 experts): those run the runtime's own grouped path (``runtime.expert_math.part_rows``, one part holding
every expert), whose calls are padded to the tall tiles. Each tile of an expert's rows reads the expert's weight
over the host link, so the tall tiles read it half as often: on the H200 the all-UVA Qwen3-MoE plan at 12 GB ran
a 2,048-token prefill in 302.5 ms against 491.5 through the module, its logits bit for bit the resident model's
(docs/BENCHMARKS.md, 2026-12-02 20:14). Other calls (decode) keep the module's own forward, and with it the host
time the cost model's figures hold.

Under ``torch.compile`` every call keeps the module's own forward: compiled, the padded path rounds otherwise
than the resident model's compiled forward (on the H200: the tiny Qwen3-MoE's 512-token prefill in
tests/test_uva_experts_gpu.py, where the module's forward is exact, and the Qwen3-MoE shape's 2,048-token prefill
under ``mode="reduce-overhead"``, logits 0.039 apart in both runs, 290 ms). At that shape the module's forward is
not exact either: 473-499 ms, and 0.039 apart in four runs of six (docs/BENCHMARKS.md, 2026-12-03, both sessions).
A plan's graph-mode prediction assumes the tall tiles (captured eagerly, as ``torch.cuda.graph`` does); a compiled
prefill with experts on UVA runs slower than it.

``install`` puts a ``TallTileForward`` on each such module as an instance attribute; ``restore`` takes it away.
The params are not touched: the forward reads them at each call, wherever the offloader has put their data."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from runtime.dtensor import is_dtensor
from runtime.expert_math import Layout, grouped, is_experts_module, join_rows, part_rows
from schemas.grouped_tiles import padded_rows
from schemas.plan import Plan

_ABSENT = object()


def tall_tiles_apply(hidden: torch.Tensor, index: torch.Tensor, experts: int) -> bool:
    """Whether a call of ``hidden`` routed by ``index`` over ``experts`` experts gains the tall tiles here."""
    pairs = index.numel()
    return hidden.device.type == "cuda" and grouped(hidden, experts) and padded_rows(pairs, experts) > pairs


class TallTileForward:
    """An experts module's forward: its own, but for the calls ``tall_tiles_apply`` picks."""

    def __init__(self, module: nn.Module, own) -> None:
        self.module, self.own = module, own
        self.layout = Layout.of(module)
        self.experts = int(module.num_experts)
        self.tables: dict[torch.device, torch.Tensor] = {}

    def __call__(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                 *args, **kwargs) -> torch.Tensor:
        if (args or kwargs or torch.compiler.is_compiling()
                or not tall_tiles_apply(hidden_states, top_k_index, self.experts)):
            return self.own(hidden_states, top_k_index, top_k_weights, *args, **kwargs)
        device = hidden_states.device
        table = self.tables.get(device)
        if table is None:
            table = self.tables[device] = torch.arange(self.experts, device=device)
        weights = {name: getattr(self.module, name) for name in self.layout.names}
        rows = part_rows(self.module, self.layout, weights, table, hidden_states, top_k_index, top_k_weights)
        return join_rows(rows, hidden_states.shape[0], hidden_states.dtype)


def uva_experts_modules(plan: Plan, model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) of each experts module of which the plan reads a tensor through UVA (layers whose experts
    are split by expert have their own forward: runtime/cpu_experts.py)."""
    on_uva = {f"{layer.name}.{rel}" for layer in plan.layers if layer.experts is None for rel in layer.uva}
    if not on_uva:
        return
    for path, module in model.named_modules():
        if path and is_experts_module(module) and isinstance(getattr(module, "num_experts", None), int):
            names = Layout.of(module).names
            if any(is_dtensor(getattr(module, name, None)) for name in names):
                continue  # tensor-parallel shards: the module's own forward knows their placements, part_rows not
            if any(f"{path}.{name}" in on_uva for name in names):
                yield path, module


class UvaExperts:
    """The tall-tile forwards of one applied plan: ``install``, then ``restore`` (also after a failed apply)."""

    def __init__(self) -> None:
        self.forwards: list[tuple[nn.Module, object]] = []

    def install(self, plan: Plan, model: nn.Module) -> None:
        for _, module in uva_experts_modules(plan, model):
            previous = module.__dict__.get("forward", _ABSENT)
            own = module.forward
            self.forwards.append((module, previous))
            module.forward = TallTileForward(module, own)

    def restore(self) -> list[str]:
        while self.forwards:
            module, previous = self.forwards.pop()
            if previous is _ABSENT:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
        return []
