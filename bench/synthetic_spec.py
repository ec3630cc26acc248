"""Large synthetic specs for benchmarks and tests: many layers, each listed on its own (no repeat)."""

from __future__ import annotations

PARAM_KINDS = ("weight", "bias")


def synthetic_spec_text(num_layers: int = 1000, params_per_layer: int = 20, hidden: int = 1024,
                        gpu_budget: str | None = None) -> str:
    """YAML of an embedding, ``num_layers`` blocks ``model.layers.<i>`` and a head.

    Each block has ``params_per_layer`` params: ``params_per_layer // 2`` linear weights and biases
    under ``attn.`` and ``mlp.`` (so ``params: [mlp]`` selects about half of each block).
    """
    lines = ["model:", "  name: synthetic", "  dtype: bfloat16", "  layers:",
             "    - name: model.embed_tokens", f"      params: {{weight: [32000, {hidden}]}}"]
    block = []
    for k in range(params_per_layer):
        group = "attn" if k < params_per_layer // 2 else "mlp"
        kind = PARAM_KINDS[k % 2]
        shape = f"[{hidden}, {hidden}]" if kind == "weight" else f"[{hidden}]"
        block.append(f"        {group}.proj{k // 2}.{kind}: {shape}")
    for i in range(num_layers):
        lines += [f"    - name: model.layers.{i}", "      params:", *block]
    lines += ["    - name: model.norm", f"      params: {{weight: [{hidden}]}}",
              "    - name: lm_head", f"      params: {{weight: [32000, {hidden}]}}"]
    if gpu_budget is not None:
        lines += ["memory:", f"  gpu_budget: {gpu_budget}"]
    return "\n".join(lines) + "\n"
