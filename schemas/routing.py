"""Measured routing of an MoE model: per layer, how many tokens each routed expert received.

Written by the runtime (``runtime.record_routing(model)`` or ``apply(..., record_routing=True)`` then
``Handle.routing_stats()``, saved with ``schemas.io.dump_model``) and read by ``planner plan --routing FILE``,
which keeps the most used experts on the GPU and predicts with the measured rates instead of uniform
routing. A file names the layers by the spec's names; ``spec_problems`` says where a spec does not match it.

```yaml
routing_version: 1
model: Qwen3MoeForCausalLM
source: runtime.record_routing over 64 prompts of 128 tokens
layers:
  - {layer: model.layers.0, experts: 128, top_k: 8, tokens: 8192, counts: [512, 3, ...]}
```

Each token picks ``top_k`` distinct experts, so a layer's counts add up to ``tokens * top_k``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from schemas.fields import Count, PositiveCount
from schemas.spec import Layer
from schemas.spec_layers import moe_shape
from schemas.spec_names import DottedName, PrintableName, PrintableText
from schemas.fields import StrictModel

ROUTING_VERSION = 1
# a layer's recording estimates each expert's chance of being picked once it gave each expert this many choices on
# average; one decode step of 32 tokens (2 choices an expert of 128, top-8) does not: read as chances, its unseen
# experts are never touched and its seen ones less often than they were, so predictions with it under-count the
# experts a step touches (UVA plans 0.82x their measured step on the H200, bench/results/predict-h200-2026-12-02l)
MIN_CHOICES_PER_EXPERT = 16


class LayerRouting(StrictModel):
    layer: DottedName = Field(description="the spec's name of the layer (model.layers.3)")
    experts: PositiveCount
    top_k: PositiveCount
    tokens: Count = Field(description="tokens routed through the layer while recording")
    counts: list[Count] = Field(description="per expert, the tokens routed to it")

    @model_validator(mode="after")
    def _consistent(self) -> LayerRouting:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) is larger than experts ({self.experts})")
        if len(self.counts) != self.experts:
            raise ValueError(f"counts lists {len(self.counts)} experts, the layer has {self.experts}")
        most = max(self.counts, default=0)
        if most > self.tokens:
            raise ValueError(f"an expert received {most} tokens of the {self.tokens} routed: a token picks "
                             f"{self.top_k} distinct experts, so no expert receives more than every token")
        if sum(self.counts) != self.tokens * self.top_k:
            raise ValueError(f"counts add up to {sum(self.counts)}, but {self.tokens} tokens each routed to "
                             f"{self.top_k} experts make {self.tokens * self.top_k}")
        return self

    @property
    def choices_per_expert(self) -> float:
        """The choices the recording gave each expert on average (tokens · top_k / experts)."""
        return self.tokens * self.top_k / self.experts

    def shares(self) -> list[float]:
        """Per expert, the chance that a token picks it (uniform k/E before any token was seen)."""
        if not self.tokens:
            return [self.top_k / self.experts] * self.experts
        return [c / self.tokens for c in self.counts]


class RoutingStats(StrictModel):
    FILE_KIND: ClassVar[str] = "routing statistics"

    routing_version: Literal[1] = ROUTING_VERSION
    model: PrintableName
    source: PrintableText = Field(default="", description="how the routing was recorded (inputs, machine, date)")
    layers: list[LayerRouting] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> RoutingStats:
        seen: set[str] = set()
        for layer in self.layers:
            if layer.layer in seen:
                raise ValueError(f"layer '{layer.layer}' is listed twice")
            seen.add(layer.layer)
        return self

    def by_layer(self) -> dict[str, LayerRouting]:
        return {layer.layer: layer for layer in self.layers}

    def shares(self) -> dict[str, list[float]]:
        """layer -> each expert's chance of being picked by a token (what the cost model reads)."""
        return {layer.layer: layer.shares() for layer in self.layers}

    def thin(self) -> list[LayerRouting]:
        """The layers whose recording gave each expert fewer than ``MIN_CHOICES_PER_EXPERT`` choices on average (one
        that saw no token is read as uniform routing, not as a sample)."""
        return [layer for layer in self.layers if 0 < layer.choices_per_expert < MIN_CHOICES_PER_EXPERT]


class RoutingRef(StrictModel):
    """The routing statistics a plan was made with (``planner plan --routing FILE``)."""

    file: PrintableText = Field(description="the file as it was given")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the file's text (UTF-8)")


def spec_problems(stats: RoutingStats, layers: Sequence[Layer]) -> list[str]:
    """Where the spec's MoE layers (expanded, in order) differ from the ones the statistics were recorded on."""
    recorded = stats.by_layer()
    problems = []
    moe = [layer for layer in layers if layer.moe is not None]
    for layer in moe:
        r = recorded.get(layer.name)
        if r is None:
            problems.append(f"the spec's MoE layer {layer.name} has no routing in the file")
        elif (r.experts, r.top_k) != moe_shape(layer.moe):
            problems.append(f"{layer.name}: the spec has {layer.moe.experts} experts, top-{layer.moe.top_k}; the file "
                            f"recorded {r.experts} experts, top-{r.top_k}")
    names = {layer.name for layer in moe}
    extra = [r.layer for r in stats.layers if r.layer not in names]
    if extra:
        problems.append(f"the file has routing for {', '.join(extra[:4])}{' …' if len(extra) > 4 else ''}, which "
                        "the spec has no MoE layer of")
    return problems


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
