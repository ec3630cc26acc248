"""Tiny transformers MoE models (random weights) and plans that split their experts, for the cpu backend's tests."""

from __future__ import annotations

from collections.abc import Callable

import torch

import runtime
from planner.assemble import Assignment, assemble
from planner.cost.predict import predict
from planner.layers import build_graph, layers_in_order
from schemas import Plan
from schemas.hardware import load_hardware
from schemas.plan_experts import ExpertSplit
from schemas.spec_hash import spec_sha256
from schemas.workload import DEFAULT_WORKLOAD

COMMON = dict(vocab_size=512, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)


def _configs():
    import transformers

    return {
        "qwen3_moe": (transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
            **COMMON, head_dim=32, intermediate_size=256, num_experts=16, num_experts_per_tok=4,
            moe_intermediate_size=64)),
        "mixtral": (transformers.MixtralForCausalLM, transformers.MixtralConfig(
            **COMMON, intermediate_size=128, num_local_experts=8, num_experts_per_tok=2)),
        "olmoe": (transformers.OlmoeForCausalLM, transformers.OlmoeConfig(
            **COMMON, intermediate_size=64, num_experts=16, num_experts_per_tok=4, eos_token_id=None,
            pad_token_id=None)),
    }


ARCHITECTURES = ("qwen3_moe", "mixtral", "olmoe")


def make_moe(arch: str, seed: int = 0, implementation: str = "eager"):
    """A tiny ``arch`` model in bf16 on the CPU, its experts computed as ``implementation`` says."""
    cls, config = _configs()[arch]
    torch.manual_seed(seed)
    model = cls(config).to(torch.bfloat16).eval()
    model.set_experts_implementation(implementation)
    return model


def random_call(config, experts: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An experts module's call at ``tokens`` random tokens of a model of ``config``: bf16 hidden states, each
    token's top-k distinct experts of ``experts`` and their softmax weights (bf16)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, config.hidden_size, generator=g).to(torch.bfloat16)
    k = config.num_experts_per_tok
    index = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    topw = torch.softmax(torch.randn(tokens, k, generator=g), -1).to(torch.bfloat16)
    return hidden, index, topw


def by_thirds(experts: int) -> dict[str, list[int]]:
    """Expert e on the GPU, through UVA or on the host by e mod 3."""
    places = ("gpu", "uva", "cpu")
    return {p: [e for e in range(experts) if e % 3 == i] for i, p in enumerate(places)}


def split_plan(model, places: Callable[[int], dict[str, list[int]]] | None = None, cpu_max_tokens: int | None = None,
               layers: tuple[int, ...] | None = None, only: tuple[str, ...] | None = None) -> Plan:
    """A plan of ``model`` that splits the experts of its decoder layers (``layers``: which of them, default all)
    as ``places(experts)`` says (default: by thirds); everything else resident. ``only``: split just these of
    the experts' params (a plan the runtime must refuse)."""
    spec = runtime.describe(model)
    spec_layers = layers_in_order(build_graph(spec.model.expanded()))
    experts = {}
    for layer in spec_layers:
        if layer.moe is None or (layers is not None and int(layer.name.rsplit(".", 1)[1]) not in layers):
            continue
        params = [t.name for t in layer.params if t.name.rpartition(".")[0].endswith("experts")
                  and t.shape[0] == layer.moe.experts and (only is None or t.name.rpartition(".")[2] in only)]
        placed = (places or by_thirds)(layer.moe.experts)
        backend_max = cpu_max_tokens if placed.get("cpu") else None
        experts[layer.name] = ExpertSplit(params=params, cpu_max_tokens=backend_max, **placed)
    plan = assemble(spec_layers, Assignment({}, None, "budget", "test split", experts=experts),
                    model_name=spec.model.name, spec_sha256=spec_sha256(spec))
    return plan.model_copy(update={"predictions": predict(plan, load_hardware(), DEFAULT_WORKLOAD)})
