"""diffusers' group offloading (``diffusers.hooks.apply_group_offloading``) as a contender for bench_compare.py.

The configurations swept, as its documentation describes them (one block per group; ``use_stream``
prefetches the next group on a side stream from pinned copies; ``record_stream`` lets the offload
skip a sync with the compute stream; ``low_cpu_mem_usage`` pins on the fly instead of keeping pinned
copies). ``target`` is the module the call is given:

- "" (the whole ``*ForCausalLM``): what the docs show for a generic ``torch.nn.Module``, and what the
  first measurement did. Block level only groups ``ModuleList``/``Sequential`` *children* of the module
  it is given; a causal LM's children are ``model`` and ``lm_head``, so no block is found and the whole
  model lands in one "unmatched" group that is moved every forward (see docs/BENCHMARKS.md).
- "model" (the decoder stack): its ``layers`` ModuleList becomes one group per block; the embedding,
  final norm and rotary buffers are its unmatched group; ``lm_head`` (outside the call) stays on the GPU.

Leaf level hooks every ``Linear``/``Embedding`` and groups the remaining params by their parent module,
so it is given the whole model.
"""

from __future__ import annotations

import torch
from torch import nn

BLOCK = {"offload_type": "block_level", "num_blocks_per_group": 1}
LEAF = {"offload_type": "leaf_level"}
STREAM = {"use_stream": True}
RECORD = {"use_stream": True, "record_stream": True}
LOWMEM = {"use_stream": True, "record_stream": True, "low_cpu_mem_usage": True}

CONFIGS: dict[str, dict] = {
    "block-top-stream": {"target": "", **BLOCK, **STREAM},  # the issue's configuration
    "block": {"target": "model", **BLOCK},
    "block-stream": {"target": "model", **BLOCK, **STREAM},
    "block-stream-record": {"target": "model", **BLOCK, **RECORD},
    "block-stream-record-lowmem": {"target": "model", **BLOCK, **LOWMEM},
    "leaf": {"target": "", **LEAF},
    "leaf-stream": {"target": "", **LEAF, **STREAM},
    "leaf-stream-record": {"target": "", **LEAF, **RECORD},
    "leaf-stream-record-lowmem": {"target": "", **LEAF, **LOWMEM},
}


def needs_cuda(name: str) -> bool:
    return bool(CONFIGS[name].get("use_stream"))


def apply(model: nn.Module, name: str, device: torch.device) -> dict:
    """Apply configuration ``name`` to ``model``: its target moves to the CPU (diffusers' flow: load on
    the CPU, the hooks onload to the GPU), the rest stays on ``device``."""
    from diffusers.hooks import apply_group_offloading

    options = dict(CONFIGS[name])
    target = model.get_submodule(options.pop("target"))
    moved = sum(p.numel() * p.element_size() for p in target.parameters())
    target.to("cpu")
    apply_group_offloading(target, onload_device=device, offload_device=torch.device("cpu"), **options)
    return {"moved_bytes": moved, "config": CONFIGS[name]}
