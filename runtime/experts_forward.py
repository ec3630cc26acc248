"""Experts modules not split by expert: prefill calls in tall tiles where read through UVA, decode calls from CUDA
graphs.

Every experts module of a plan's layers whose experts are not split by expert (runtime/cpu_experts.py has its own
forward for those) runs transformers' experts module as it is, but for two kinds of call:

- **Tall tiles** (where the module reads a tensor through UVA): the calls that torch's grouped matmul would cut
  into short tiles while tall ones are within reach (schemas/grouped_tiles.py: more than 64 and at most 128 rows an
  expert on average; a 2,048-token prefill at top-8 of 128 experts) run the runtime's own grouped path
  (``runtime.expert_math.part_rows``, one part holding every expert), whose calls are padded to the tall tiles.
  Each tile of an expert's rows reads the expert's weight over the host link, so the tall tiles read it half as
  often: on the H200 the all-UVA Qwen3-MoE plan at 12 GB ran a 2,048-token prefill in 302.5 ms against 491.5
  through the module, its logits bit for bit the resident model's (docs/BENCHMARKS.md, 2026-12-02 20:14).
- **Layer graphs**: eager calls of at most ``GRAPHED_MAX_TOKENS`` tokens (decode) replay CUDA graphs of the
  module's own forward (runtime/shape_graphs.py, with ``apply``'s ``expert_graphs``: by default where the plan counts them), where that
  forward reads no value back (transformers' ``grouped_mm`` and ``batched_mm`` experts; its per-expert loop reads
  the routing back) and the plan copies no tensor of the module into a prefetch slot (schemas/expert_graphs.py,
  the rule the planner prices): resident modules and modules read through UVA alike. An eager decode call is
  some 46 of the host's launches, a replay 4, and gives the same values bit for bit; at decode an eager step is
  the host's launches, so a plan's resident layers are graphed too (else reading experts through UVA would make
  an eager step faster than keeping them, and a larger budget a slower plan).

Under ``torch.compile`` every call keeps the module's own forward: compiled, the padded path rounds otherwise
than the resident model's compiled forward (on the H200: the tiny Qwen3-MoE's 512-token prefill in
tests/test_experts_forward_gpu.py, where the module's forward is exact, and the Qwen3-MoE shape's 2,048-token prefill
under ``mode="reduce-overhead"``, logits 0.039 apart in both runs, 290 ms). At that shape the module's forward is
not exact either: 473-499 ms, and 0.039 apart in four runs of six (docs/BENCHMARKS.md, 2026-12-03, both sessions).
A plan's graph-mode prediction assumes the tall tiles (captured eagerly, as ``torch.cuda.graph`` does); a compiled
prefill with experts on UVA runs slower than it.

``install`` puts an ``ExpertsForward`` on each module that takes either kind of call, as an instance attribute;
``restore`` takes it away. The params are not touched: the forward reads them at each call, wherever the offloader
has put their data (a graph reads the addresses it was captured with: should they move, the module runs as
launched from then on)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from runtime.dtensor import is_dtensor
from runtime.expert_math import Layout, grouped, is_experts_module, join_rows, part_rows
from runtime.shape_graphs import GraphPool, ShapeGraphs
from schemas.expert_graphs import module_graphed
from schemas.grouped_tiles import padded_rows
from schemas.plan import Plan
from schemas.plan_content import PlanLayer

_ABSENT = object()
CAPTURABLE = frozenset({"grouped_mm", "batched_mm"})
"""transformers' experts implementations whose forward reads no value back (its ``eager`` one loops over the
experts the routing reached, read back to the host)."""


def reads_nothing_back(module: nn.Module) -> bool:
    """Whether transformers' experts ``module`` computes without reading a value back (a graph can hold it)."""
    return getattr(getattr(module, "config", None), "_experts_implementation", None) in CAPTURABLE


def tall_tiles_apply(hidden: torch.Tensor, index: torch.Tensor, experts: int) -> bool:
    """Whether a call of ``hidden`` routed by ``index`` over ``experts`` experts gains the tall tiles here."""
    pairs = index.numel()
    return hidden.device.type == "cuda" and grouped(hidden, experts) and padded_rows(pairs, experts) > pairs


class ExpertsForward:
    """An experts module's forward: its own, but for the calls ``tall_tiles_apply`` picks (``tall``: where the
    module reads a tensor through UVA) and the decode calls its ``graphs`` replay."""

    def __init__(self, module: nn.Module, own, tall: bool) -> None:
        self.module, self.own, self.tall = module, own, tall
        self.layout = Layout.of(module)
        self.experts = int(module.num_experts)
        self.tables: dict[torch.device, torch.Tensor] = {}
        self.graphs: ShapeGraphs | None = None  # decode calls of the module's own forward, from CUDA graphs

    def addresses(self) -> tuple[int, ...]:
        """Where the module's expert tensors are now (a graph holds the addresses of its capture)."""
        return tuple(getattr(self.module, name).data_ptr() for name in self.layout.names)

    def __call__(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                 *args, **kwargs) -> torch.Tensor:
        if args or kwargs or torch.compiler.is_compiling():
            return self.own(hidden_states, top_k_index, top_k_weights, *args, **kwargs)
        if not (self.tall and tall_tiles_apply(hidden_states, top_k_index, self.experts)):
            return (self.graphs or self.own)(hidden_states, top_k_index, top_k_weights)
        device = hidden_states.device
        table = self.tables.get(device)
        if table is None:
            table = self.tables[device] = torch.arange(self.experts, device=device)
        weights = {name: getattr(self.module, name) for name in self.layout.names}
        rows = part_rows(self.module, self.layout, weights, table, hidden_states, top_k_index, top_k_weights)
        return join_rows(rows, hidden_states.shape[0], hidden_states.dtype)


def experts_modules(plan: Plan, model: nn.Module) -> Iterator[tuple[PlanLayer, str, nn.Module, bool]]:
    """(plan layer, path relative to it, module, whether the plan reads a tensor of it through UVA) of each experts
    module (transformers 5's, stacked) of the plan's layers whose experts are not split by expert (runtime/
    cpu_experts.py has its own forward for those), but tensor-parallel shards (DTensors: the module's own forward
    knows their placements, ``part_rows`` not)."""
    for layer in plan.layers:
        if layer.experts is not None or layer.moe is None:
            continue
        on_uva = set(layer.uva)
        try:
            holder = model.get_submodule(layer.name)
        except AttributeError:  # a layer that is not one module (its params found one by one by runtime/check.py)
            continue
        for path, module in holder.named_modules():
            if path and is_experts_module(module) and isinstance(getattr(module, "num_experts", None), int):
                names = Layout.of(module).names
                if not any(is_dtensor(getattr(module, name, None)) for name in names):
                    yield layer, path, module, any(f"{path}.{name}" in on_uva for name in names)


class ExpertsForwards:
    """The experts modules' forwards of one applied plan: ``install``, then ``restore`` (also after a failed
    apply). With a ``pool`` (``apply``'s ``expert_graphs``, on a GPU) decode calls replay graphs of it where
    schemas/expert_graphs.py and ``reads_nothing_back`` allow; without one only modules read through UVA get a
    forward (their tall tiles)."""

    def __init__(self, pool: GraphPool | None = None) -> None:
        self.forwards: list[tuple[nn.Module, object]] = []
        self.pool = pool

    def install(self, plan: Plan, model: nn.Module) -> None:
        for layer, path, module, tall in experts_modules(plan, model):
            forward = ExpertsForward(module, module.forward, tall)
            if (self.pool is not None and reads_nothing_back(module)
                    and module_graphed([f"{path}.{n}" for n in forward.layout.names], layer.uva, layer.offloaded)):
                forward.graphs = self.pool.wrap(forward.own, f"{layer.name}.{path}", stamp=forward.addresses)
            if forward.tall or forward.graphs is not None:
                self.forwards.append((module, module.__dict__.get("forward", _ABSENT)))
                module.forward = forward

    def restore(self) -> list[str]:
        while self.forwards:
            module, previous = self.forwards.pop()
            if previous is _ABSENT:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
        return []
