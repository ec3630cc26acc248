"""The offloader life cycle shared by every backend, and the no-op backend (the factory is in runtime/apply.py).

``apply`` moves the data (host arenas, resident params) and then drives an offloader:
``wrap_modules`` registers hooks, ``post_init`` finishes set-up once modules are
wrapped (points params at their buffers or views), ``sync_prev_onload`` blocks until
any copy in flight has landed, ``join_after_forward`` makes the compute stream wait
for the copy stream at the end of a forward, and ``remove`` undoes the hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from runtime.forward_gate import ForwardGate
from runtime.tensors import TensorRef
from schemas import Plan


@dataclass(eq=False)
class Offloaded:
    """An offloaded param: where it lives in the model and its host copy (pinned under CUDA)."""

    ref: TensorRef
    host: torch.Tensor


@dataclass(eq=False)
class Offloader:
    name = "base"

    plan: Plan
    model: nn.Module
    device: torch.device
    offloaded: list[Offloaded]
    collect_stats: bool = False
    hooks: list[RemovableHandle] = field(default_factory=list)
    gate: ForwardGate | None = None  # where forwards must run one at a time (runtime/forward_gate.py)

    def offloaded_pairs(self) -> list[tuple[TensorRef, torch.Tensor]]:
        return [(o.ref, o.host) for o in self.offloaded]

    def uva_pairs(self) -> list[tuple[TensorRef, torch.Tensor]]:
        """The offloaded params the plan puts on UVA (its layers' ``uva`` lists)."""
        on_uva = {(layer.name, rel) for layer in self.plan.layers for rel in layer.uva}
        return [(o.ref, o.host) for o in self.offloaded if (o.ref.layer, o.ref.rel) in on_uva]

    # -- life cycle -------------------------------------------------------------------
    def wrap_modules(self) -> None:
        """Register the hooks the backend needs (none by default)."""

    def post_init(self) -> None:
        """Finish set-up after the modules are wrapped."""

    def sync_prev_onload(self) -> None:
        """Block until every copy issued so far has landed."""

    def join_after_forward(self) -> None:
        """Make the compute stream wait for the copy stream (end of a forward)."""

    def forward_stats(self) -> list[dict]:
        return []

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks.clear()


class NoOffloader(Offloader):
    """Backend ``none``: everything is resident; nothing to do."""

    name = "none"
