"""The whole GPU in the plan (issue 20): the plan's peak against ``torch.cuda.max_memory_allocated()``, and the
batch chosen for tokens per second against a sweep of batches by hand.

    PYTHONPATH=. python bench/bench_memory.py --out $OUT/memory.jsonl        # the H200, about 5 minutes
    PYTHONPATH=. python bench/bench_memory.py --only phi3 --out $OUT/m.jsonl  # one model
    python bench/bench_memory.py --dry-run --out /tmp/memory.jsonl           # the CPU, tiny models, seconds

Models (transformers, random bf16 weights built on the device, described with ``runtime.describe``):
``llama``, the Llama-3-8B shape; ``moe``, the Qwen3-MoE shape of bench_cost.py (24 layers, 128 experts, top 8);
``phi3``, Phi-3-mini (``Phi3ForCausalLM``: fused ``qkv_proj`` and ``gate_up_proj``, 32 heads of 96, a 32,064
vocabulary), an architecture no other file of this repository names.

Memory, at three budgets per model, each forward with its own plan (strategy auto, eager):
- ``decode-1`` and ``decode-32``: ``generate()`` (greedy, ``disable_compile``) of NEW tokens from a KV cache
  that holds CONTEXT - NEW tokens already (random keys and values), so the cache holds CONTEXT tokens at the
  last step, with transformers' ``StaticCache`` (CONTEXT long) and ``DynamicCache``; the plan's workload is
  ``decode: {batch: B, context: CONTEXT, logits: last}``;
- ``prefill-2048`` and ``prefill-8192``: one forward, ``use_cache=False``, every token's logits; the plan's
  workload is ``prefill: {tokens: T}``.
A row has the plan's peak and its parts, the measured peak (the peak statistic reset after the cache is filled,
read after the call), measured / planned, whether that is within -5% / +2%, and whether it is over the budget.

Tokens per second, at two budgets: the plan of ``decode: {batch: auto, context: CONTEXT}`` (planner/memory/
throughput.py), its batch measured (static cache, eager, the median step after WARM steps), then the batches of
a sweep by hand (a half and three quarters of it, and the largest batch the search tried beside it), each
with its own plan: predicted and measured tokens per second, and the chosen batch against the best measured.

``--dry-run`` runs the same logic on the CPU with tiny models of the three architectures, a 64-token context and
no workspace allowance; there is no ``max_memory_allocated`` there, so the peak is the resident weights and
buffers plus the largest set of tensors alive at once in the call, counted tensor by tensor with a
``TorchDispatchMode`` (``LiveBytes``). tests/test_bench_memory.py runs it.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import statistics
import sys
import time
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from bench_cost import random_model  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

GB = 10**9
LLAMA = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8)
QWEN_MOE = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[])
PHI3 = dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=32, max_position_embeddings=8192, sliding_window=None, pad_token_id=0)
SMALL = {"llama": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2),
         "moe": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[]),
         "phi3": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=4, sliding_window=None, pad_token_id=0)}
FULL = {"llama": LLAMA, "moe": QWEN_MOE, "phi3": PHI3}
# three budgets per model for memory (the first offloads at batch 1; decode-32's cache needs the larger ones),
# the last two for tokens per second
BUDGETS = {"llama": (8 * GB, 24 * GB, 32 * GB), "moe": (12 * GB, 20 * GB, 28 * GB), "phi3": (6 * GB, 40 * GB, 60 * GB)}
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
           "phi3": ("Phi3Config", "Phi3ForCausalLM")}
SMALL_BUDGETS = (0.4, 0.7, 1.3)  # of the tiny models' weights, beyond what the plan counts besides them


class Setup:
    """What one run measures: the full shapes on the GPU, or the tiny ones on the CPU."""

    def __init__(self, dry_run: bool, device: str, mode: str = "eager") -> None:
        self.dry_run, self.mode = dry_run, mode  # mode: the tokens-per-second rows' decode step (eager or graph)
        self.device = torch.device("cpu" if dry_run else device)
        self.context = 64 if dry_run else 4096
        self.batches = (1, 4) if dry_run else (1, 32)
        self.prefills = (16, 48) if dry_run else (2048, 8192)
        self.new = 3 if dry_run else 6  # tokens generated in a memory row (its steps timed after the first)
        self.steps, self.warm = (3, 1) if dry_run else (10, 3)  # decode steps of a tokens-per-second row


# ---------------------------------------------------------------------------
# the peak: CUDA's statistic, or the tensors alive at once on the CPU


class LiveBytes(TorchDispatchMode):
    """The bytes of tensor storages made under the mode and alive at once (their peak): an op's output that is
    no view of an input is a new storage; it is freed when the last tensor viewing it dies."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, list[int]] = {}  # data_ptr -> [tensors alive, bytes]
        self.live = self.peak = 0

    def _drop(self, ptr: int) -> None:
        r = self.refs.get(ptr)
        if r is not None:
            r[0] -= 1
            if r[0] == 0:
                self.live -= r[1]
                del self.refs[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        for i, t in enumerate(tree_flatten(out)[0]):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr == 0:
                continue
            if ptr in self.refs:
                self.refs[ptr][0] += 1
            elif i < len(returns) and returns[i].alias_info is not None:
                continue  # a view of something made before the mode
            else:
                self.refs[ptr] = [1, storage.nbytes()]
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._drop, ptr)
        return out


class Meter:
    """The peak of a call: ``torch.cuda.max_memory_allocated`` from ``start()`` on CUDA; on the CPU the bytes
    that exist before (``base``: the plan's resident weights and buffers) and the tensors counted since."""

    def __init__(self, device: torch.device, base: int) -> None:
        self.device, self.base = device, base
        self.mode = LiveBytes() if device.type == "cpu" else None

    def __enter__(self) -> Meter:
        if self.mode is not None:
            self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.mode is not None:
            self.mode.__exit__(*exc)

    def start(self) -> None:
        if self.mode is not None:
            self.mode.peak = self.mode.live
        else:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        if self.mode is not None:
            return self.base + self.mode.peak
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)


# ---------------------------------------------------------------------------
# the model, its KV cache and the calls measured


def build(kind: str, setup: Setup):
    import transformers

    config_cls, model_cls = (getattr(transformers, n) for n in CLASSES[kind])
    config = config_cls(**(SMALL if setup.dry_run else FULL)[kind])
    return random_model(model_cls, config, setup.device), config


def filled_cache(model, config, kind: str, batch: int, tokens: int, length: int, device: torch.device):
    """A KV cache (``static``: ``length`` long; ``dynamic``) holding ``tokens`` random tokens per sequence."""
    from transformers import DynamicCache, StaticCache

    text = config.get_text_config()
    heads, kv = text.num_attention_heads, text.num_key_value_heads or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    cache = StaticCache(config=config, max_cache_len=length) if kind == "static" else DynamicCache(config=config)
    g = torch.Generator(device=device).manual_seed(2)
    for layer in range(text.num_hidden_layers):
        # both from the seeded generator: two caches filled alike hold the same values (a probe compares the tokens
        # decoded from each; randn_like drew the values from the global generator, another draw each call)
        k, v = (torch.randn(batch, kv, tokens, head_dim, device=device, dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        cache.update(k, v, layer)
        del k, v
    return cache


def generate(model, cache, batch: int, tokens: int, new: int, vocab: int, device: torch.device, clock=None,
             graph: bool = False):
    """Greedy ``generate()`` of ``new`` tokens after the ``tokens`` the cache holds; ``graph`` (a static cache on
    CUDA): transformers compiles the decode step as it does by default (inductor, CUDA-graph trees: the plan's
    ``mode: graph``), else every step runs eagerly. (The ``cudagraphs`` backend is no graph mode a user runs: it
    copies every parameter on each replay, bench_generate.py's finding, and measured Phi-3-mini's steps 4-5x
    slower than graph replay predicts: bench/results/phi3-graph-h200-2026-12-02/.)"""
    from transformers import LogitsProcessorList

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (batch, tokens + 1), generator=g).to(device)
    how = {} if graph and device.type == "cuda" else {"disable_compile": True}
    with torch.no_grad():
        return model.generate(ids, past_key_values=cache, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              pad_token_id=0, eos_token_id=None, **how,
                              logits_processor=LogitsProcessorList([clock] if clock is not None else []))


class StepClock:
    """The time between consecutive decode steps (a logits processor runs once a step)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.marks, self.cpu = device, [], []

    def __call__(self, _ids, scores):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.marks.append(time.perf_counter())
        self.cpu.append(time.thread_time())  # this thread's CPU time: near the wall time when the step is CPU-bound
        return scores

    @staticmethod
    def _median(marks: list[float], warm: int) -> float:
        gaps = [(b - a) * 1e3 for a, b in zip(marks, marks[1:])][warm:]
        return statistics.median(gaps) if gaps else float("nan")

    def step_ms(self, warm: int) -> float:
        return self._median(self.marks, warm)

    def cpu_ms(self, warm: int) -> float:
        return self._median(self.cpu, warm)


def plan_for(spec, budget: int, item: WorkloadItem, name: str):
    try:
        return planner.plan(spec, gpu_budget=budget, workload=Workload({name: item})), None
    except InfeasibleError as err:
        return None, err.message.splitlines()[0]


def parts(plan) -> dict:
    s, m = plan.summary, plan.memory
    return {"weights": s.resident_bytes, "buffers": s.buffer_bytes, "kv_cache": m.kv_cache_bytes,
            "activations": m.activation_bytes, "workspace": m.workspace_bytes, "largest": m.forwards[0].largest}


def step_row(plan, item: WorkloadItem, clock: StepClock, warm: int) -> dict:
    """A timed decode's figures (bench/decode_rows.py predicts them again): its workload, the plan's predicted
    step, the measured median step and the CPU time in it, the bytes the plan offloaded."""
    return {"batch": item.batch, "context": item.context, "logits": item.logits,
            "predicted_step_ms": plan.predictions.workloads[0].step_ms,
            "measured_step_ms": round(clock.step_ms(warm), 3), "cpu_step_ms": round(clock.cpu_ms(warm), 3),
            "offloaded_bytes": plan.summary.offloaded_bytes}


def judged(planned: int, measured: int, budget: int) -> dict:
    ratio = measured / planned
    return {"planned": planned, "measured": measured, "ratio": round(ratio, 4), "within": 0.95 <= ratio <= 1.02,
            "over_budget": measured > budget}


# ---------------------------------------------------------------------------
# the two measurements


def memory_rows(kind: str, model, config, spec, setup: Setup, budgets, write) -> None:
    vocab = config.get_text_config().vocab_size
    cases = [(f"decode-{b}", WorkloadItem(batch=b, context=setup.context, logits="last")) for b in setup.batches]
    cases += [(f"prefill-{t}", WorkloadItem(tokens=t)) for t in setup.prefills]
    for budget in budgets:
        for label, item in cases:
            name = label.split("-")[0]
            plan, why = plan_for(spec, budget, item, name)
            row = {"kind": "memory", "model": kind, "budget": budget, "workload": label}
            if plan is None:
                write({**row, "status": "infeasible", "why": why})
                continue
            t0 = time.perf_counter()
            base = plan.summary.resident_bytes + plan.summary.buffer_bytes
            with runtime.apply(plan, model, device=setup.device), Meter(setup.device, base) as meter:
                for cache in (("static", "dynamic") if name == "decode" else (None,)):
                    meter.start()
                    if cache is None:
                        ids = torch.randint(0, vocab, (1, item.tokens), generator=torch.Generator().manual_seed(4))
                        with torch.no_grad():
                            out = model(ids.to(setup.device), use_cache=False)
                        del out
                    else:
                        held = setup.context - setup.new
                        kv = filled_cache(model, config, cache, item.batch, held, setup.context, setup.device)
                        meter.start()  # the cache is the plan's to count, its filling is not
                        clock = StepClock(setup.device)
                        out = generate(model, kv, item.batch, held, setup.new, vocab, setup.device, clock)
                        del kv, out
                    measured = meter.peak()
                    timed = {} if cache is None else step_row(plan, item, clock, 1)
                    write({**row, "cache": cache, "plan_peak": plan.summary.peak_gpu_bytes, **parts(plan),
                           **judged(plan.summary.peak_gpu_bytes, measured, budget), **timed,
                           "seconds": round(time.perf_counter() - t0, 2)})


def throughput_rows(kind: str, model, config, spec, setup: Setup, budgets, write) -> None:
    vocab = config.get_text_config().vocab_size
    for budget in budgets:
        auto, why = plan_for(spec, budget, WorkloadItem(batch="auto", context=setup.context, mode=setup.mode), "decode")
        if auto is None:
            write({"kind": "throughput", "model": kind, "budget": budget, "status": "infeasible", "why": why})
            continue
        chosen = auto.throughput.batch
        largest = max(o.batch for o in auto.throughput.options)
        sweep = sorted({chosen, max(1, chosen // 2)} if setup.dry_run else
                       {chosen, largest, *(max(1, chosen * k // 4) for k in (2, 3))})
        measured = {}
        for batch in sweep:
            item = WorkloadItem(batch=batch, context=setup.context, mode=setup.mode)
            here = f"{kind} {budget / 1e9:g} GB batch {batch}"
            _progress(f"{here}: planning")
            plan = auto if batch == chosen else plan_for(spec, budget, item, "decode")[0]
            if plan is None:
                continue
            _progress(f"{here}: applying ({plan.summary.backend})")
            with runtime.apply(plan, model, device=setup.device):
                _progress(f"{here}: generating")
                sizes = ForwardSizes(model)
                held = setup.context - setup.steps
                kv = filled_cache(model, config, "static", batch, held, setup.context, setup.device)
                clock = StepClock(setup.device)
                generate(model, kv, batch, held, setup.steps, vocab, setup.device, clock, graph=setup.mode == "graph")
                del kv
                sizes.remove()
            _progress(f"{here}: tokens a forward {sizes.tokens[:4]}...")
            timed = step_row(plan, item, clock, setup.warm)
            measured[batch] = batch * 1000 / timed["measured_step_ms"]
            write({"kind": "throughput", "model": kind, "budget": budget, "chosen": batch == chosen, "cache": "static",
                   "mode": setup.mode,
                   "predicted_tokens_per_s": round(batch * 1000 / timed["predicted_step_ms"], 2),
                   "measured_tokens_per_s": round(measured[batch], 2), **timed,
                   "kv_cache": plan.memory.kv_cache_bytes})
        best = max(measured, key=lambda b: measured[b])
        write({"kind": "throughput-summary", "model": kind, "budget": budget, "chosen": chosen, "mode": setup.mode,
               "predicted_tokens_per_s": auto.throughput.tokens_per_s,
               "measured_tokens_per_s": round(measured[chosen], 2),
               "measured_over_predicted": round(measured[chosen] / auto.throughput.tokens_per_s, 4),
               "best_batch_by_hand": best, "chosen_over_best": round(measured[chosen] / measured[best], 4)})


class ForwardSizes:
    """The tokens of each forward of the model's decoder while it is held (a decode step feeds one a sequence); the
    eager forwards only (a step torch.compile traces is not counted)."""

    def __init__(self, model) -> None:
        self.tokens: list[int] = []
        decoder = getattr(model, "model", model)

        def hook(_module, args, kwargs):
            if torch.compiler.is_compiling():  # a compiled step is not counted: a guard on the list's length would
                return  # recompile the step at every token (measured: 5 s a step in graph mode)
            x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
            x = x if x is not None else args[0]
            self.tokens.append(int(x.shape[:2].numel()))

        self._handle = decoder.register_forward_pre_hook(hook, with_kwargs=True)

    def remove(self) -> None:
        self._handle.remove()


def _progress(what: str) -> None:
    """Where a long run is (stderr: the rows stay on stdout), so that a run cut by a time limit says where."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def _timed_ms(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def probe_rows(setup: Setup, write) -> None:
    """The kernels of an attention step over a static cache, alone (planner/cost/block.py): transformers' repeat_kv
    (a copy of a broadcast view: ``strided_copy_gbps``, bytes read + written), a contiguous copy of the same bytes,
    and SDPA at one query token over the repeated keys and values with a mask (the static cache's) and over the
    grouped ones without (``enable_gqa``: a dynamic cache without padding), as GB/s of the bytes each reads."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    batch, kv_heads, rep, head_dim = (2, 2, 4, 16) if setup.dry_run else (32, 8, 4, 128)
    g = torch.Generator(device=setup.device).manual_seed(5)
    k = torch.randn(batch, kv_heads, setup.context, head_dim, device=setup.device, dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    q = torch.randn(batch, kv_heads * rep, 1, head_dim, device=setup.device, dtype=torch.bfloat16, generator=g)
    mask = torch.ones(batch, 1, 1, setup.context, device=setup.device, dtype=torch.bool)

    def repeat(x):
        return x[:, :, None].expand(batch, kv_heads, rep, *x.shape[2:]).reshape(batch, kv_heads * rep, *x.shape[2:])

    big = repeat(k)
    n = 3 if setup.dry_run else 20
    copy_ms = _timed_ms(lambda: repeat(k), setup.device, n)
    plain_ms = _timed_ms(lambda: big.clone(), setup.device, n)
    masked_ms = _timed_ms(lambda: sdpa(q, big, repeat(v), attn_mask=mask), setup.device, n) - copy_ms
    gqa_ms = _timed_ms(lambda: sdpa(q, k, v, enable_gqa=True), setup.device, n)
    kb = k.numel() * k.element_size()
    write({"kind": "probe", "batch": batch, "kv_heads": kv_heads, "repeat": rep, "head_dim": head_dim,
           "context": setup.context, "repeat_kv_ms": round(copy_ms, 4),
           "strided_copy_gbps": round(kb * (1 + rep) / copy_ms / 1e6, 3),
           "contiguous_copy_gbps": round(2 * kb * rep / plain_ms / 1e6, 3),
           "sdpa_masked_read_gbps": round(2 * kb * rep / max(masked_ms, 1e-6) / 1e6, 3),
           "sdpa_gqa_read_gbps": round(2 * kb / gqa_ms / 1e6, 3)})
    del k, v, q, big


def described(model, kind: str, setup: Setup):
    spec = runtime.describe(model, name=kind)
    if setup.dry_run:  # a CPU run has no library workspaces
        spec = spec.model_copy(update={"memory": spec.memory.model_copy(update={"workspace": 0, "graphs": 0})})
    return spec


def budgets_of(kind: str, spec, setup: Setup) -> tuple[int, ...]:
    if not setup.dry_run:
        return BUDGETS[kind]
    weights = sum(layer.nbytes for layer in spec.model.expanded())
    need = planner.plan(spec, backend="none", workload=Workload(
        {"decode": WorkloadItem(batch=max(setup.batches), context=setup.context, logits="last")})).memory
    return tuple(int(weights * f) + need.non_weight_bytes for f in SMALL_BUDGETS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny models on the CPU (what the test suite runs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", choices=sorted(FULL), action="append", help="these models only (repeatable)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-memory", action="store_true", help="the tokens-per-second rows only")
    ap.add_argument("--mode", choices=("eager", "graph"), default="eager",
                    help="the tokens-per-second rows' decode step: eager, or graph (compiled, CUDA-graph replay)")
    ap.add_argument("--out", default=f"bench/results/memory-{datetime.date.today().isoformat()}.jsonl")
    ap.add_argument("--stall-s", type=float, default=None,
                    help="end the run with every thread's stack on stderr when no row comes for this long (a "
                         "stalled run says where, and a device call's later commands still run)")
    args = ap.parse_args(argv)
    setup = Setup(args.dry_run, args.device, args.mode)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with out.open("w") as f:
        def write(row: dict) -> None:
            if args.stall_s:
                faulthandler.dump_traceback_later(args.stall_s, exit=True)  # armed at each row (the first at once)
            row = {**row, "at_s": round(time.perf_counter() - started, 1)}
            line = json.dumps(row)
            print(line, flush=True)
            f.write(line + "\n")
            f.flush()

        write({"kind": "setup", "device": torch.cuda.get_device_name(setup.device) if setup.device.type == "cuda"
               else "cpu", "torch": torch.__version__, "transformers": __import__("transformers").__version__,
               "context": setup.context, "dry_run": setup.dry_run})
        probe_rows(setup, write)
        for kind in args.only or sorted(FULL):
            _progress(f"{kind}: building")
            model, config = build(kind, setup)
            spec = described(model, kind, setup)
            budgets = budgets_of(kind, spec, setup)
            if not args.skip_memory:
                memory_rows(kind, model, config, spec, setup, budgets, write)
            if not args.skip_throughput:
                throughput_rows(kind, model, config, spec, setup, budgets[1:], write)
            del model
            if setup.device.type == "cuda":
                torch.cuda.empty_cache()
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        mem = [r for r in rows if r["kind"] == "memory" and "ratio" in r]
        write({"kind": "summary", "budgets": sorted({r["budget"] for r in mem}), "memory_rows": len(mem),
               "within": sum(r["within"] for r in mem),
               "over_budget": sum(r["over_budget"] for r in mem),
               "ratios": [min((r["ratio"] for r in mem), default=None), max((r["ratio"] for r in mem), default=None)],
               "seconds": round(time.perf_counter() - started, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
