"""What an eager forward costs the CPU that issues it: a small kernel and a small copy (``launch_us``,
``copy_call_us``), and one more decoder block or routed expert of tiny transformers Llama and Qwen3-MoE models
(``block_cpu_us``, ``moe_block_cpu_us``, ``expert_cpu_us``, ``moe_sync``), and what a forward costs outside its
blocks (``model_cpu_us``)."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from runtime.calibrate.timers import _wall_ms


def cpu_costs(device: torch.device) -> dict[str, float]:
    x = torch.zeros(16, device=device)
    n = 2000

    def launches() -> None:
        for _ in range(n):
            x.add_(1)

    host = torch.zeros(1024, dtype=torch.uint8).pin_memory()
    dst = torch.empty(1024, dtype=torch.uint8, device=device)

    def copies() -> None:
        for _ in range(n):
            dst.copy_(host, non_blocking=True)

    return {"launch_us": _wall_ms(launches, repeat=5) * 1e3 / n, "copy_call_us": _wall_ms(copies, repeat=5) * 1e3 / n}


def _forward_ms(model: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.inference_mode():
        return _wall_ms(lambda: model(ids, use_cache=False), repeat=21, warmup=3)


TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16)  # the tiny transformers models a block's fixed costs are measured on: their work is nothing


TINY_BLOCKS = (4, 20)  # the tiny models' depths: one more block costs the difference over the blocks between


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


# the tiny models with a real model's head width (128): whether attention then takes the kernels a real model's
# does (bench_predict_h200's CPU row measures both shapes beside the model's own block, 2026-12-02)
TINY_WIDE_HEADS = dict(TINY, hidden_size=512, intermediate_size=1024, head_dim=128)


def tiny_llama(layers: int, shape: dict | None = None) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **(shape or TINY)))


def tiny_moe(layers: int, top_k: int = 2, shape: dict | None = None) -> torch.nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=layers, num_experts=8, num_experts_per_tok=top_k,
                                              moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[],
                                              **(shape or TINY)))


def _by_depth(time_ms: Callable[[torch.nn.Module], float], make: Callable[[int], torch.nn.Module]) -> dict[int, float]:
    """``time_ms`` of the tiny model ``make`` builds, at each of ``TINY_BLOCKS`` depths."""
    return {n: time_ms(make(n)) for n in TINY_BLOCKS}


def _per_block_us(times: dict[int, float]) -> float:
    """Microseconds one more block adds, from ``_by_depth``'s times."""
    few, many = TINY_BLOCKS
    return (times[many] - times[few]) / (many - few) * 1e3


def model_cpu_us(times: dict[int, float], block_us: float) -> float:
    """Microseconds an eager forward spends outside its blocks: ``_by_depth``'s time at the fewer blocks less those
    blocks at ``block_us`` each (the tiny model's embedding, rotary tables, masks, norm, head and output: the same
    Python as a real model's, whose kernels are as few)."""
    few = TINY_BLOCKS[0]
    return max(0.0, times[few] * 1e3 - few * block_us)


def model_cpu_costs(device: torch.device) -> dict[str, object]:
    """CPU time of one more eager decoder block (dense and MoE), of the forward outside its blocks, and of one
    more routed expert per token, from tiny transformers models whose GPU work is negligible."""
    if not _has_transformers():
        return {}
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)

    def forward_ms(model: torch.nn.Module) -> float:
        return _forward_ms(model.to(device, torch.bfloat16).eval(), ids)

    dense, sparse = _by_depth(forward_ms, tiny_llama), _by_depth(forward_ms, tiny_moe)
    block_us = _per_block_us(dense)
    figures: dict[str, object] = {"block_cpu_us": block_us, "moe_block_cpu_us": _per_block_us(sparse),
                                  "model_cpu_us": model_cpu_us(dense, block_us)}
    # grouped expert kernels cost the same whatever the experts a batch touches; a per-expert loop
    # (transformers' eager experts) costs launches per expert and reads the routing back first
    implementation = getattr(tiny_moe(1).config, "_experts_implementation", None)
    looped = implementation in (None, "eager")
    figures["moe_sync"] = looped
    many = TINY_BLOCKS[1]  # the tiny MoE at top-6 against top-2: 4 more experts a token in each of its blocks
    figures["expert_cpu_us"] = max(0.0, (forward_ms(tiny_moe(many, 6)) - sparse[many]) / many / 4 * 1e3) \
        if looped else 0.0
    return figures


def block_cpu_us(blocks: Sequence[torch.nn.Module], forward: Callable[[], object], repeat: int = 5,
                 warmup: int = 2) -> float:
    """Host microseconds one of ``blocks`` takes in an eager ``forward()`` of the model that holds them: from
    its forward pre-hook to its forward hook, the median over blocks and runs (the garbage collector held off).
    ``block_cpu_us`` and ``moe_block_cpu_us`` measured on the model itself rather than on
    ``model_cpu_costs``'s tiny ones: on a forward the GPU keeps up with (a decode step of a resident model),
    a block's host time is the time the CPU takes to issue it."""
    times: list[float] = []
    started: dict[int, float] = {}

    def before(module, _args) -> None:
        started[id(module)] = time.perf_counter()

    def after(module, _args, _out) -> None:
        times.append((time.perf_counter() - started.pop(id(module))) * 1e6)

    hooks = [h for b in blocks for h in (b.register_forward_pre_hook(before), b.register_forward_hook(after))]
    try:
        for _ in range(warmup):
            forward()
        times.clear()
        gc.collect()
        gc.disable()
        try:
            for _ in range(repeat):
                forward()
        finally:
            gc.enable()
    finally:
        for h in hooks:
            h.remove()
    if not times:
        raise ValueError("block_cpu_us: no block ran in the forward")
    return statistics.median(times)
