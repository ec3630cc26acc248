"""Recording an MoE model's routing: per layer, how many tokens each routed expert received.

A forward pre-hook on every experts module (transformers 5: ``forward(hidden_states, top_k_index,
top_k_weights)``, runtime/expert_math.py) adds the step's choices into a counter on the module's device
(``scatter_add_``: nothing is read back, so recording costs no sync and a captured CUDA graph keeps counting
in replay). ``stats()`` reads the counters once and returns ``schemas.routing.RoutingStats``, named by the
layers of the spec (the longest layer name that holds the experts module), ready for ``planner plan --routing``.

``record_routing(model)`` records on any model (with ``with``, or ``remove()``); ``apply(plan, model,
record_routing=True)`` records while a plan is applied, read with ``Handle.routing_stats()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from runtime.errors import ApplyError
from runtime.expert_math import is_experts_module
from schemas.routing import LayerRouting, RoutingStats


@dataclass(eq=False)
class _Counter:
    layer: str
    experts: int
    counts: torch.Tensor | None = None  # int64 [experts], on the routing's device
    tokens: torch.Tensor | None = None
    top_k: int = 0


@dataclass(eq=False)
class RoutingRecorder:
    counters: list[_Counter] = field(default_factory=list)
    hooks: list[RemovableHandle] = field(default_factory=list)

    def watch(self, layer: str, module: nn.Module) -> None:
        counter = _Counter(layer, int(getattr(module, "num_experts")))
        self.counters.append(counter)

        def hook(_module, args, kwargs):
            index = kwargs["top_k_index"] if "top_k_index" in kwargs else args[1]
            if counter.counts is None:
                counter.counts = torch.zeros(counter.experts, dtype=torch.long, device=index.device)
                counter.tokens = torch.zeros((), dtype=torch.long, device=index.device)
                counter.top_k = index.shape[-1]
            flat = index.reshape(-1).long()
            counter.counts.scatter_add_(0, flat, torch.ones_like(flat))
            counter.tokens.add_(flat.numel() // counter.top_k)

        self.hooks.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def stats(self, model: str, source: str = "") -> RoutingStats:
        """What was recorded so far (layers no forward reached are left out)."""
        layers = [LayerRouting(layer=c.layer, experts=c.experts, top_k=c.top_k, tokens=int(c.tokens.item()),
                               counts=c.counts.tolist()) for c in self.counters if c.counts is not None]
        if not layers:
            raise ApplyError("no routing recorded yet: run the model forward (on sample inputs) first")
        return RoutingStats(model=model, source=source or "runtime.record_routing", layers=layers)

    def reset(self) -> None:
        for c in self.counters:
            c.counts = c.tokens = None

    def remove(self) -> None:
        while self.hooks:
            self.hooks.pop().remove()

    def __enter__(self) -> RoutingRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def experts_modules(model: nn.Module, layers: Iterable[str]) -> list[tuple[str, nn.Module]]:
    """(layer name, experts module) for every experts module below one of ``layers`` (the longest that holds it)."""
    names = sorted(set(layers), key=len, reverse=True)
    out = []
    for path, module in model.named_modules():
        if path and is_experts_module(module) and isinstance(getattr(module, "num_experts", None), int):
            owner = next((n for n in names if path.startswith(n + ".") or path == n), None)
            if owner is not None:
                out.append((owner, module))
    return out


def record_routing(model: nn.Module, layers: Iterable[str] | None = None) -> RoutingRecorder:
    """Start recording ``model``'s routing; ``layers``: the spec's layer names (default: runtime.describe's)."""
    if layers is None:
        from runtime.describe import find_layers

        layers = [name for name, _ in find_layers(model)]
    recorder = RoutingRecorder()
    found = experts_modules(model, layers)
    if not found:
        raise ApplyError("the model has no experts module (forward(hidden_states, top_k_index, top_k_weights), as "
                         "transformers 5 writes MoE experts) to record the routing of")
    for layer, module in found:
        recorder.watch(layer, module)
    return recorder
