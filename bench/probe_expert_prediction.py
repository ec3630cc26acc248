"""Can a layer's routed experts be known before its router runs? (issue 17: speculative expert prefetch)

    PYTHONPATH=. python bench/probe_expert_prediction.py > $OUT/expert-prediction.jsonl       # the H200
    python bench/probe_expert_prediction.py --device cpu --small                               # tiny, any machine

An MoE decode step with its experts read through UVA is the resident step plus the experts' read (docs/
BENCHMARKS.md, "The experts' kernels through UVA"): a layer's experts are known only once its router has run on
that layer's input. Reading them earlier (into GPU memory, while the layers before compute) needs a guess. Two
guesses, scored against the experts each layer's router then picks, over the decode steps of greedy generation
from random prompts (transformers' dynamic cache), per layer and overall:

- ``next_router``: layer L+1's own router (after its ``post_attention_layernorm``) applied to the residual stream
  as it enters layer L's MLP, i.e. before layer L's experts and layer L+1's attention have added to it;
- ``same_as_last_token``: the experts this layer picked at the previous decode step (what a cache of the last
  token's experts would hold).

A hit is a picked expert that was in the guess (of the same size, top-k); the share of hits is what a
speculative read would save of the experts' bytes on the critical path, and ``1 - hits`` the wasted reads.
Random-weight models route unlike trained ones (their residual stream is dominated by a few directions), so
these are figures for this bench's models, not a trained model's."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_memory import Setup, build  # noqa: E402


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return list(model.model.layers)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="the tiny Qwen3-MoE (3 layers, 8 experts, top-2)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new", type=int, default=48, help="decode steps a prompt")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    model, config = build("moe", Setup(args.small, args.device))
    layers = decoder_layers(model)
    top_k = config.num_experts_per_tok
    picked: dict[int, torch.Tensor] = {}  # layer -> this step's experts [tokens, k]
    guessed: dict[int, torch.Tensor] = {}  # layer -> next_router's guess for it, made at the layer before
    hits: dict[str, dict[int, list[float]]] = {"next_router": defaultdict(list), "same_as_last_token": defaultdict(list)}
    last: dict[int, torch.Tensor] = {}
    decoding = {"on": False}

    def overlap(guess: torch.Tensor, real: torch.Tensor) -> float:
        g, r = guess.reshape(-1, top_k), real.reshape(-1, top_k)
        return float((g.unsqueeze(2) == r.unsqueeze(1)).any(dim=2).float().mean())

    def before_mlp_norm(i: int):
        def hook(_module, args):
            if not decoding["on"] or i + 1 >= len(layers):
                return
            residual = args[0]
            following = layers[i + 1]
            with torch.no_grad():
                x = following.post_attention_layernorm(residual).reshape(-1, residual.shape[-1])
                guessed[i + 1] = following.mlp.gate(x)[2]
        return hook

    def after_gate(i: int):
        def hook(_module, _args, out):
            if not decoding["on"]:
                return
            real = out[2]
            if i in guessed:
                hits["next_router"][i].append(overlap(guessed.pop(i), real))
            if i in last and last[i].shape == real.shape:
                hits["same_as_last_token"][i].append(overlap(last[i], real))
            last[i] = real.detach().clone()
        return hook

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.post_attention_layernorm.register_forward_pre_hook(before_mlp_norm(i)))
        handles.append(layer.mlp.gate.register_forward_hook(after_gate(i)))
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for _ in range(args.prompts):
            ids = torch.randint(0, config.vocab_size, (1, 64), generator=g).to(device)
            out = model(ids, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            last.clear()
            decoding["on"] = True
            for _ in range(args.new):
                out = model(token, past_key_values=cache, use_cache=True)
                cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            decoding["on"] = False
    for h in handles:
        h.remove()
    for name, per_layer in hits.items():
        means = {i: sum(v) / len(v) for i, v in sorted(per_layer.items()) if v}
        overall = sum(sum(v) for v in per_layer.values()) / max(1, sum(len(v) for v in per_layer.values()))
        print(json.dumps({"guess": name, "layers": len(layers), "experts": config.num_experts, "top_k": top_k,
                          "steps": args.prompts * args.new, "hits": round(overall, 4),
                          "per_layer": {str(i): round(m, 3) for i, m in means.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
