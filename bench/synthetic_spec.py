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


def moe_spec_text(num_layers: int = 1000, dense: int = 3, experts: int = 4, hidden: int = 1024,
                  inter: int = 512) -> str:
    """YAML of a DeepSeek-like MoE: ``num_layers`` decoder blocks, the first ``dense`` with a dense MLP,
    the others with a router, ``experts`` routed experts and a shared expert, each listed on its own.

    Kinds (schemas/kinds.py): attention, norm, dense_mlp, router, routed_experts, shared_experts, so
    ``--prefer routed_experts,dense_mlp`` gives a ladder of three tiers.
    """
    h, i = hidden, inter
    common = [f"        input_layernorm.weight: [{h}]", f"        post_attention_layernorm.weight: [{h}]"]
    common += [f"        self_attn.{p}_proj.weight: [{h}, {h}]" for p in "qkvo"]
    mlp = [f"        mlp.gate_proj.weight: [{4 * i}, {h}]", f"        mlp.up_proj.weight: [{4 * i}, {h}]",
           f"        mlp.down_proj.weight: [{h}, {4 * i}]"]
    moe = [f"        mlp.gate.weight: [{experts}, {h}]"]
    for e in range(experts):
        moe += [f"        mlp.experts.{e}.gate_proj.weight: [{i}, {h}]", f"        mlp.experts.{e}.up_proj.weight: [{i}, {h}]",
                f"        mlp.experts.{e}.down_proj.weight: [{h}, {i}]"]
    moe += [f"        mlp.shared_experts.{p}.weight: [{i}, {h}]" for p in ("gate_proj", "up_proj")]
    moe += [f"        mlp.shared_experts.down_proj.weight: [{h}, {i}]"]
    lines = ["model:", "  name: synthetic-moe", "  dtype: bfloat16", "  layers:",
             "    - name: model.embed_tokens", f"      params: {{weight: [32000, {h}]}}"]
    for n in range(num_layers):
        lines += [f"    - name: model.layers.{n}", "      params:", *common, *(mlp if n < dense else moe)]
    lines += ["    - name: model.norm", f"      params: {{weight: [{h}]}}",
              "    - name: lm_head", f"      params: {{weight: [32000, {h}]}}"]
    return "\n".join(lines) + "\n"
