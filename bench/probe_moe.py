"""Where an eager transformers MoE block makes the CPU wait for the GPU (one decode forward,
torch.profiler): the source of the experts' forward and the ops that read results back."""

from __future__ import annotations

import inspect

import torch
import transformers
from transformers.models.qwen3_moe import modeling_qwen3_moe as q

print("transformers", transformers.__version__)
print(inspect.getsource(q.Qwen3MoeExperts.forward))
print(inspect.getsource(q.Qwen3MoeSparseMoeBlock.forward))
small = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
model = q.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**small)).to("cuda", torch.bfloat16).eval()
print("experts implementation:", getattr(model.config, "_experts_implementation", None))
ids = torch.zeros(1, 1, dtype=torch.long, device="cuda")
with torch.inference_mode():
    model(ids, use_cache=False)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(ids, use_cache=False)
        torch.cuda.synchronize()
names = [e.name for e in prof.events()]
sync = [n for n in names if any(k in n for k in ("item", "nonzero", "_local_scalar", "Synchronize", "tolist", "where"))]
print("sync-like ops in order:", sync)
