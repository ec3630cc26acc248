"""Does `generate()` run on a model whose routed experts the host computes (the cpu backend)? A probe.

    PYTHONPATH=. python bench/probe_host_generate.py [--device cuda] [--timeout 120]

A small Qwen3-MoE (random bf16 weights), planned with ``--backends routed_experts=cpu`` at a budget that
offloads the experts, applied; then, each under a watchdog that prints every thread's stack and ends the process
when a stage takes longer than ``--timeout`` seconds: a forward; ``generate()`` with the dynamic cache; and
bench_memory.py's own decode (a static cache filled beforehand, a logits processor that synchronizes every
step). Each stage's tokens are compared with the resident model's; one JSON line a stage.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import bench_memory as bm  # noqa: E402
import planner  # noqa: E402
import runtime  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

CONFIG = dict(vocab_size=4096, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=2, head_dim=128, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512,
              decoder_sparse_step=1, mlp_only_layers=[])
TINY = bm.SMALL["moe"]


def host_computes_all(plan):
    """The plan with every expert its split reads through UVA computed by the host instead (the probe wants the
    host's thread at work whatever the cost model says)."""
    layers = []
    for layer in plan.layers:
        split = layer.experts
        if split is not None and split.uva:
            split = split.model_copy(update={"cpu": sorted(split.cpu + split.uva), "uva": []})
            layer = layer.model_copy(update={"experts": split})
        layers.append(layer)
    summary = plan.summary.model_copy(update={"backend": "mixed"})
    return plan.model_copy(update={"layers": layers, "summary": summary})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    import transformers

    config = transformers.Qwen3MoeConfig(**(CONFIG if device.type == "cuda" else TINY))
    model = bm.random_model(transformers.Qwen3MoeForCausalLM, config, device)
    spec = runtime.describe(model, name="probe")
    weights = sum(layer.nbytes for layer in spec.model.expanded())
    item = WorkloadItem(batch=args.batch, context=64)
    need = planner.plan(spec, backend="none", workload=Workload({"decode": item})).memory.non_weight_bytes
    plan = planner.plan(spec, gpu_budget=need + weights // 4, workload=Workload({"decode": item}),
                        backends={"routed_experts": "cpu"})
    plan = host_computes_all(plan)
    print(json.dumps({"plan": plan.summary.backend, "notes": [n[:160] for n in plan.summary.notes if "cpu" in n]}),
          flush=True)
    vocab, held, new = config.vocab_size, 60, 6

    def bench_decode(held=held, length=80):  # bench_memory.py's throughput decode
        kv = bm.filled_cache(model, config, "static", args.batch, held, length, device)
        print(json.dumps({"cache_holds": int(kv.get_seq_length())}), flush=True)
        clock = bm.StepClock(device)
        return bm.generate(model, kv, args.batch, held, new, vocab, device, clock)[:, -new:]

    sizes = bm.ForwardSizes(model)  # the tokens of each forward (a prefill of the whole prompt shows here)

    ids = torch.randint(0, vocab, (args.batch, 16), generator=torch.Generator().manual_seed(1)).to(device)

    def dynamic():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                                  eos_token_id=None, disable_compile=True)[:, -new:]

    def forward():
        with torch.no_grad():
            return model(ids).logits[:, -1].argmax(-1)

    stages = {"forward": forward, "generate_dynamic": dynamic, "bench_static_decode": bench_decode,
              "bench_static_decode_4096": lambda: bench_decode(4090, 4100)}
    want = {name: fn() for name, fn in stages.items()}
    with runtime.apply(plan, model, device=device):
        for name, fn in stages.items():
            faulthandler.dump_traceback_later(args.timeout, exit=True)
            t = time.perf_counter()
            sizes.tokens.clear()
            got = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            faulthandler.cancel_dump_traceback_later()
            print(json.dumps({"stage": name, "seconds": round(time.perf_counter() - t, 2),
                              "same_tokens": bool(torch.equal(got, want[name])),
                              # the host rounds otherwise than the GPU: how many of the tokens agree (after the
                              # first that differs, a sequence's later tokens follow another prefix)
                              "tokens_agree": round(float((got == want[name]).float().mean()), 4),
                              "first_tokens_agree": round(float((got[..., :1] == want[name][..., :1]).float().mean()),
                                                          4),
                              "tokens_per_forward": sizes.tokens[:8]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
