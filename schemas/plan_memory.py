"""What a plan counts on the GPU besides the weights and their buffers: the KV cache, the activations'
peak, a workspace allowance and the layer graphs' memory (the plan's ``memory`` section).

The plan's ``summary.peak_gpu_bytes`` is the whole GPU: resident weights + buffer pool + ``kv_cache_bytes``
+ ``activation_bytes`` + ``workspace_bytes`` + ``graph_bytes`` (``PARTS``), within ``gpu_budget_bytes``. Per
forward of the workload (``forwards``) the plan records what it assumed (tokens, sequences, context, which
logits) and what that forward needs: its KV cache (``batch x context x kv_bytes_per_token``) and its
activations' peak (the largest set of activations alive at once, ``largest`` says where). The plan's KV
cache is the largest forward's (``kv_cache: workload``), a reservation (``reserved``, ``--kv-cache SIZE``)
or what the plan leaves of the budget (``auto``); its activations are the largest forward's.
``planner.memory`` computes the figures; ``schemas.memory_check`` re-proves that they add up when a plan is
loaded. Plans written before this section existed have none: their peak is weights and buffers alone.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.fields import Count, PositiveCount, StrictModel
from schemas.spec_names import PrintableName, PrintableText
from schemas.workload import MAX_TOKENS, Logits

KvSizing = Literal["workload", "reserved", "auto"]

PARTS = (("kv_cache_bytes", "KV cache"), ("activation_bytes", "activations"), ("workspace_bytes", "workspace"),
         ("graph_bytes", "layer graphs"))
"""The memory section's parts (field, what it is in a line of figures), each on the GPU beside the weights."""
PART_WORDS = dict(PARTS)


class ForwardMemory(StrictModel):
    """One forward of the workload: what the plan assumed it holds and what it needs on the GPU."""

    workload: PrintableName
    tokens: PositiveCount = Field(le=MAX_TOKENS, description="rows the forward pushes through each weight")
    batch: PositiveCount = Field(description="sequences in the forward")
    context: Count = Field(default=0, description="tokens each sequence holds in the KV cache (0: none counted)")
    logits: Logits = Field(default="all", description="all: every token's logits; last: each sequence's last")
    kv_cache_bytes: Count = Field(description="batch x context x kv_bytes_per_token")
    activation_bytes: Count = Field(description="the largest set of activations alive at once")
    largest: PrintableText = Field(default="", description="where the activations peak")


class PlanMemory(StrictModel):
    kv_cache_bytes: Count = Field(description="GPU bytes of the KV cache")
    activation_bytes: Count = Field(description="the activations' peak of the largest forward")
    workspace_bytes: Count = Field(description="library workspaces (cuBLAS), an allowance")
    graph_bytes: Count = Field(
        default=0, description="the CUDA graphs of routed experts' decode calls (runtime/shape_graphs.py): their "
        "static inputs and outputs and their pool's segments, at most (planner/memory/graphs.py); 0 without "
        "routed experts, and in plans written before the runtime kept them")
    kv_cache: KvSizing = Field(default="workload", description="how the KV cache was sized: workload (the largest "
                               "forward's), reserved (memory.kv_cache SIZE) or auto (what the plan leaves)")
    kv_cache_dtype: PrintableName = Field(description="dtype of the cached keys and values")
    kv_bytes_per_token: Count | None = Field(
        default=None, description="bytes a token of context takes in the KV cache, all layers (absent: the "
        "spec's attention could not be sized and no forward keeps a KV cache)")
    activations: Literal["model", "spec"] = Field(
        default="model", description="model: computed from the shapes; spec: memory.activations")
    forwards: list[ForwardMemory] = Field(min_length=1)

    @property
    def non_weight_bytes(self) -> int:
        """What the plan counts on the GPU besides weights and buffers."""
        return sum(n for _, n in self.parts())

    def parts(self, listed: bool = False) -> list[tuple[str, int]]:
        """(field, bytes) of each part (``PARTS``); ``listed``: those a reader is shown (no layer graphs' line in a
        plan without any)."""
        return [(name, getattr(self, name)) for name, _ in PARTS
                if not (listed and name == "graph_bytes" and not self.graph_bytes)]

    @property
    def kv_tokens(self) -> int | None:
        """Tokens of context the KV cache holds (None when a token's size is unknown or 0)."""
        if not self.kv_bytes_per_token:
            return None
        return self.kv_cache_bytes // self.kv_bytes_per_token

    def forward(self, name: str) -> ForwardMemory | None:
        return next((f for f in self.forwards if f.workload == name), None)
