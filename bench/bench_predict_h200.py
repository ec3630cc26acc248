"""Predicted against measured step time on one H200, at least 40 plans in one run (issue 19).

    PYTHONPATH=. python bench/bench_predict_h200.py 2>&1 | tee $OUT/predict-h200.log      # the H200 run, < 5 min
    PYTHONPATH=. python bench/bench_predict_h200.py --graph --only llama --time-budget 400  # eager and graph replay
    PYTHONPATH=. python bench/bench_predict_h200.py --graph-only --time-budget 500      # graph replay, every plan
    python bench/bench_predict_h200.py --dry-run --device cpu --out /tmp/predict          # tiny models on the CPU

One process. First ``planner calibrate``'s measurements on this GPU (a pinned copy alone, a UVA read alone and
both at once on two streams among them: the link row), whose profile then predicts every plan. Then per
model, random bf16 weights built on the GPU from the bundled Hugging Face configs (examples/configs/):
Llama-3-8B (32 layers, 16.06 GB) and Qwen3-30B-A3B cut to its first 12 of 48 layers (15.6 GB: 128 experts,
top-8), so both fit a few minutes of pinning and timing. Before a model's first plan, every workload runs
WARMUP times untimed on the model as built (the first plan measured no longer pays for lazy set-up: the
run of 2026-12-01 measured the resident Qwen3-MoE, its first plan, at 2.27 ms a block where its later plans
with eight resident blocks took at most 1.4), and the host time of each decoder block in a decode step is
measured on the resident model (``runtime.calibrate.block_cpu_us``). Each plan of ``PLANS`` is made with
``planner.plan`` (or ``--from-vllm``) from ``runtime.describe`` of the model, for decode (1 token), decode32
(32 sequences of one token) and prefill (one sequence of 2,048 tokens) at once, saved, applied, timed per
workload (CUDA events, eager, ``use_cache=False``, the median of 3 after a warm-up, the garbage collector
held off), and removed. Budgets are shares of the model's bytes (0.5: 8 GB on Llama). The plans: every
strategy, UVA and prefetch mixed in one plan by kind (user ``--backends`` and ``auto``'s own), prefill with
few layers offloaded (group 8/1: 4 of 32), MoE experts on UVA and prefetched, vLLM's flags, and the resident
model once more at the end (the same step as at the start, or the start was still warming up).

Output: one JSON line per measurement in ``$OUT/predict-h200.jsonl`` (``--out`` or the ``OUT`` variable;
default bench/results/predict-h200-DATE/), also printed: the environment, the link, per model the CPU row
(a block's host time on the model and from calibrate, and a decode step's host time outside the blocks), one
row per plan and workload (predicted and measured ms and their ratio, with calibrate's profile and with the
block's CPU time measured on the model; the plan's link bound: its copied bytes at the copy rate plus its UVA
bytes at the read rate; the plan's name in ``plans.jsonl``, which bench/replay_predict.py reads), for prefetch
plans at decode one ``timeline`` row (one more forward with the runtime's copy statistics: each copy's and
each stall's start and end from the forward's start, late copies, the host time, and per decoder block when
the host issued it and when the GPU could start it; beside the predicted copy windows), skipped plans, and two
summaries (how many within 10%, by each prediction). For the MoE each row also carries the prediction with the
routing measured on the very inputs timed (``predicted_routed_ms``: ``runtime.record_routing`` before the first
plan, as ``planner trace`` then ``--routing`` would give it; random-weight routers are far from uniform). With
``--graph`` every plan and workload is also captured as a CUDA graph (after two warm-ups on a side stream) and
its replay timed, predicted in mode graph (no CPU issue time); a plan whose host computes experts cannot be
captured (a ``graph_refused`` row, not tried). Summaries are per mode. ``--time-budget``
(default 260 s from the start) skips what would start later, each model getting its share of what is
left, so the whole run ends within 5 minutes.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from compare_run import graph as graph_step  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
from planner.cost.layer import layers_work, touched_by  # noqa: E402
from planner.cost.predict import predict, timeline  # noqa: E402
from planner.errors import InfeasibleError, PlannerError  # noqa: E402
from runtime.calibrate.block import built  # noqa: E402
from runtime.routing import record_routing  # noqa: E402
from schemas import dump_model  # noqa: E402
from schemas.hardware import HardwareProfile, load_hardware  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402
from schemas.routing import MIN_CHOICES_PER_EXPERT  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "examples" / "configs"
WORKLOADS = Workload({"decode": WorkloadItem(tokens=1), "decode32": WorkloadItem(tokens=32),
                      "prefill": WorkloadItem(tokens=2048)})
DRY_WORKLOADS = Workload({"decode": WorkloadItem(tokens=1), "decode32": WorkloadItem(tokens=4),
                          "prefill": WorkloadItem(tokens=64)})
# model -> (bundled config, its overrides on the H200, the tiny overrides of a dry run)
_TINY_IDS = dict(bos_token_id=None, eos_token_id=None)  # the real ids lie outside a tiny vocabulary
MODELS = {
    "llama": ("llama-3-8b", {}, dict(hidden_size=64, intermediate_size=160, num_hidden_layers=8,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=256, head_dim=16,
                                     **_TINY_IDS)),
    "moe": ("qwen3-30b-a3b", dict(num_hidden_layers=12),
            dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=256, num_experts=16, num_experts_per_tok=4,
                 moe_intermediate_size=32, **_TINY_IDS)),
}
SLOW_STEP_MS = 400.0  # a step slower than this is timed once after one warm-up


@dataclass(frozen=True)
class Case:
    model: str
    label: str
    budget: float | None = None  # share of the model's bytes
    options: dict = field(default_factory=dict)  # planner.plan keyword arguments
    vllm: str | None = None  # --from-vllm flags instead


MIX = {"attention": "uva", "dense_mlp": "prefetch"}
PLANS = [
    # Llama-3-8B: the rows issue 19 names first (user mixes of UVA and prefetch, prefill with 4 layers offloaded)
    Case("llama", "no offload", options=dict(backend="none")),
    Case("llama", "mix attention=uva dense_mlp=prefetch, budget 0.5", 0.5,
         dict(strategy="budget", backend="prefetch", backends=MIX)),
    Case("llama", "group 8/1 prefetch step 1 (4 layers)", None,
         dict(strategy="group", group_size=8, num_in_group=1, backend="prefetch", prefetch_step=1)),
    Case("llama", "auto 0.5", 0.5),
    Case("llama", "mix attention=uva dense_mlp=prefetch, budget 0.75", 0.75,
         dict(strategy="budget", backend="prefetch", backends=MIX)),
    Case("llama", "mix dense_mlp=uva attention=prefetch, budget 0.75", 0.75,
         dict(strategy="budget", backend="prefetch", backends={"dense_mlp": "uva", "attention": "prefetch"})),
    Case("llama", "auto with attention=uva, 0.5", 0.5, dict(backends={"attention": "uva"})),
    Case("llama", "group 8/1 prefetch step 2 (4 layers)", None,
         dict(strategy="group", group_size=8, num_in_group=1, backend="prefetch", prefetch_step=2)),
    Case("llama", "group 16/1 prefetch step 1 (2 layers)", None,
         dict(strategy="group", group_size=16, num_in_group=1, backend="prefetch", prefetch_step=1)),
    Case("llama", "auto 0.25", 0.25),
    Case("llama", "auto 0.75", 0.75),
    Case("llama", "auto 0.875", 0.875),
    Case("llama", "budget prefetch 0.5", 0.5, dict(strategy="budget", backend="prefetch")),
    Case("llama", "budget prefetch 0.75", 0.75, dict(strategy="budget", backend="prefetch")),
    Case("llama", "budget prefetch step 3, 0.5", 0.5, dict(strategy="budget", backend="prefetch", prefetch_step=3)),
    Case("llama", "budget uva 0.75", 0.75, dict(strategy="budget", backend="uva")),
    Case("llama", "budget uva 0.875", 0.875, dict(strategy="budget", backend="uva")),
    Case("llama", "MLPs only, prefetched, 0.75", 0.75, dict(strategy="budget", backend="prefetch", kinds=["dense_mlp"])),
    Case("llama", "attention only, uva, 0.875", 0.875, dict(strategy="budget", backend="uva", kinds=["attention"])),
    Case("llama", "group 4/1 prefetch step 2 (8 layers)", None,
         dict(strategy="group", group_size=4, num_in_group=1, backend="prefetch", prefetch_step=2)),
    Case("llama", "group 2/1 prefetch step 2 (16 layers)", None,
         dict(strategy="group", group_size=2, num_in_group=1, backend="prefetch", prefetch_step=2)),
    Case("llama", "group 8/1 uva (4 layers)", None, dict(strategy="group", group_size=8, num_in_group=1, backend="uva")),
    Case("llama", "auto prefer attention, 0.5", 0.5, dict(prefer=["attention"])),
    Case("llama", "vllm --cpu-offload-gb 2", vllm="--cpu-offload-gb 2"),
    Case("llama", "vllm group 8/2 step 2", vllm="--offload-group-size 8 --offload-num-in-group 2 --offload-prefetch-step 2"),
    Case("llama", "vllm group 7/1 step 3 (2 of 4 alone in a slot)",
         vllm="--offload-group-size 7 --offload-num-in-group 1 --offload-prefetch-step 3"),
    Case("llama", "no offload, again", options=dict(backend="none")),  # the first plan measured once more, last
    # Qwen3-MoE shape
    Case("moe", "no offload", options=dict(backend="none")),
    Case("moe", "experts on uva, 0.5", 0.5, dict(strategy="budget", backend="uva", kinds=["routed_experts"])),
    Case("moe", "mix routed_experts=uva attention=prefetch, 0.4", 0.4,
         dict(strategy="budget", backend="prefetch", backends={"routed_experts": "uva", "attention": "prefetch"})),
    Case("moe", "group 4/1 prefetch step 1 (3 layers)", None,
         dict(strategy="group", group_size=4, num_in_group=1, backend="prefetch", prefetch_step=1)),
    Case("moe", "auto 0.5", 0.5),
    Case("moe", "experts prefetched step 1, 0.5", 0.5,
         dict(strategy="budget", backend="prefetch", kinds=["routed_experts"], prefetch_step=1)),
    Case("moe", "experts prefetched step 2, 0.6", 0.6,
         dict(strategy="budget", backend="prefetch", kinds=["routed_experts"], prefetch_step=2)),
    Case("moe", "mix routed_experts=prefetch attention=uva, 0.5", 0.5,
         dict(strategy="budget", backend="prefetch", backends={"routed_experts": "prefetch", "attention": "uva"})),
    Case("moe", "auto 0.3", 0.3),
    Case("moe", "auto 0.75", 0.75),
    Case("moe", "budget uva 0.6", 0.6, dict(strategy="budget", backend="uva")),
    Case("moe", "group 6/1 prefetch step 2 (2 layers)", None,
         dict(strategy="group", group_size=6, num_in_group=1, backend="prefetch", prefetch_step=2)),
    Case("moe", "group 2/1 uva (6 layers)", None, dict(strategy="group", group_size=2, num_in_group=1, backend="uva")),
    Case("moe", "auto with routed_experts=uva, 0.4", 0.4, dict(backends={"routed_experts": "uva"})),
    Case("moe", "vllm --cpu-offload-gb 4 experts", vllm="--cpu-offload-gb 4 --cpu-offload-params experts"),
    Case("moe", "vllm group 4/1 step 2 experts",
         vllm="--offload-group-size 4 --offload-num-in-group 1 --offload-prefetch-step 2 --offload-params experts"),
    Case("moe", "no offload, again", options=dict(backend="none")),
]
WARMUP = 3  # untimed forwards of each workload on the resident model, before a model's first plan


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for the rows (default $OUT, else bench/results/predict-h200-DATE)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="tiny models from the same configs, on any device")
    ap.add_argument("--profile", help="predict with this profile instead of calibrating (a CPU run takes the bundled h200)")
    ap.add_argument("--only", choices=sorted(MODELS))
    ap.add_argument("--limit", type=int, help="the first N plans of each model only")
    ap.add_argument("--time-budget", type=float, default=260.0, help="seconds from the start; later plans are skipped")
    ap.add_argument("--graph", action="store_true",
                    help="also time every plan and workload as a CUDA graph replay, predicted in mode graph")
    ap.add_argument("--graph-only", action="store_true",
                    help="time the CUDA graph replays only (no eager rows): every plan within one device call")
    return ap.parse_args(argv)


def out_folder(args: argparse.Namespace) -> Path:
    folder = args.out or os.environ.get("OUT") or str(
        ROOT / "bench" / "results" / f"predict-h200-{datetime.date.today().isoformat()}")
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_model(kind: str, dry: bool, device: torch.device):
    """The model of a bundled config, random weights in bf16 (float32 on the CPU), built on ``device``."""
    import transformers

    name, overrides, tiny = MODELS[kind]
    data = json.loads((CONFIGS / name / "config.json").read_text())
    data.update(tiny if dry else overrides)  # before the config is made: what it derives (layer types) follows
    config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    return built(lambda: transformers.AutoModelForCausalLM.from_config(config).eval(), device, dtype), config


def inputs(name: str, tokens: int, vocab: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    shape = (1, tokens) if name.startswith("prefill") else (tokens, 1)
    return torch.randint(0, vocab, shape, generator=g).to(device)


def step_ms(fn, device: torch.device) -> float:
    """Median ms of ``fn``: CUDA events on a GPU (runtime.calibrate's timer) after one warm-up, 3 timings (1
    for a step slower than SLOW_STEP_MS); elsewhere (a dry run) one call on the wall clock. The garbage
    collector is held off while it times (a collection of the model's build would land in a CPU-bound step)."""
    gc.collect()
    gc.disable()
    try:
        with torch.inference_mode():
            if device.type == "cuda":
                from runtime.calibrate import gpu_ms

                first = gpu_ms(fn, repeat=1, warmup=1)
                return first if first > SLOW_STEP_MS else gpu_ms(fn, repeat=3, warmup=0)
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    finally:
        gc.enable()


def blocks_of(model) -> torch.nn.ModuleList:
    """The model's decoder blocks: its longest ModuleList."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=len)


def warm_up(model, config, workload: Workload, device: torch.device, times: int = WARMUP) -> None:
    """``times`` untimed forwards of every workload on the model as built (nothing applied), so that no plan is
    the first to pay for lazy initialisation (kernels loaded, library heuristics, the allocator's pool)."""
    with torch.inference_mode():
        for name, item in workload.items():
            ids = inputs(name, item.tokens, config.vocab_size, device)
            for _ in range(times):
                model(ids, use_cache=False)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_cpu(model, config, workload: Workload, device: torch.device, hw: HardwareProfile,
              repeat: int = 5) -> tuple[dict, HardwareProfile]:
    """The host time of an eager decode step of the resident model, per decoder block and outside them (by the
    wall clock with the GPU's tail, and by hooks on the first and last blocks without it), and
    ``hw`` with the block figure of this model's kind (``block_cpu_us``, or ``moe_block_cpu_us`` for an MoE) and
    the time outside the blocks (``model_cpu_us``) taken from it instead of calibrate's tiny models."""
    from runtime.calibrate import block_cpu_us

    name, item = next((n, i) for n, i in workload.items() if i.tokens == 1)
    ids = inputs(name, item.tokens, config.vocab_size, device)

    walls: list[float] = []
    outside: list[float] = []  # host us before the first block and after the last, no synchronize in them
    marks: dict[str, float] = {}

    def forward():
        t0 = time.perf_counter()
        model(ids, use_cache=False)
        t1 = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        walls.append((time.perf_counter() - t0) * 1e6)
        outside.append(((marks["first"] - t0) + (t1 - marks["last"])) * 1e6)

    blocks = blocks_of(model)
    edges = [blocks[0].register_forward_pre_hook(lambda *_: marks.__setitem__("first", time.perf_counter())),
             blocks[-1].register_forward_hook(lambda *_: marks.__setitem__("last", time.perf_counter()))]
    try:
        with torch.inference_mode():
            per_block = block_cpu_us(blocks, forward, repeat=repeat, warmup=1 if repeat > 1 else 0)
    finally:
        for h in edges:
            h.remove()
    walls, outside = walls[-repeat:], outside[-repeat:]  # the timed forwards' (the garbage collector held off)
    moe = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)  # Qwen3 / Mixtral, Phi
    key = "moe_block_cpu_us" if moe else "block_cpu_us"
    row = {"type": "cpu", "figure": key, "calibrate_us": getattr(hw, key), "model_us": round(per_block, 3),
           "blocks": len(blocks), "forward_us": round(statistics.median(walls), 1),
           "outside_blocks_us": round(statistics.median(walls) - per_block * len(blocks), 1),
           "outside_hooks_us": round(statistics.median(outside), 1),
           **tiny_cpu(key, device, repeat)}
    return row, hw.model_copy(update=own_cpu_figures(row))


def own_cpu_figures(row: dict) -> dict[str, float]:
    """The profile figures a model's ``cpu`` row (``model_cpu``) measured on the model itself, to predict its eager
    steps with instead of calibrate's tiny models': its block's (``block_cpu_us`` or ``moe_block_cpu_us``) and,
    where the row has it, the time outside its blocks by hooks (``model_cpu_us``; rows before 2026-12-02 18:30 have
    none)."""
    figures = {row["figure"]: round(row["model_us"], 3)}
    if "outside_hooks_us" in row:
        figures["model_cpu_us"] = row["outside_hooks_us"]
    return figures


def tiny_cpu(key: str, device: torch.device, repeat: int) -> dict:
    """Calibrate's tiny model of the same kind measured again now, both ways: its block by hooks as the model's is
    (``tiny_hooks_us``) and by calibrate's difference of two depths (``tiny_depth_us``), and the same with a real
    model's head width (``tiny_wide_heads_*``: head_dim 128, where calibrate's tiny models have 16, which may send
    attention to other kernels): calibrate's figure has come out 1.4-1.8x the model's own on two runs
    (2026-12-02); these say whether the method, the moment or the shape differs. A GPU only (calibrate's timer
    synchronizes CUDA)."""
    if device.type != "cuda":
        return {}
    from runtime.calibrate import (TINY, TINY_BLOCKS, TINY_WIDE_HEADS, _by_depth, _forward_ms, _per_block_us,
                                   block_cpu_us, tiny_llama, tiny_moe)

    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    out = {}
    for label, shape in (("tiny", TINY), ("tiny_wide_heads", TINY_WIDE_HEADS)):
        def make(layers: int, shape=shape):
            return (tiny_moe(layers, shape=shape) if key == "moe_block_cpu_us" else tiny_llama(layers, shape))

        tiny = make(TINY_BLOCKS[1]).to(device, torch.bfloat16).eval()

        def forward(tiny=tiny):
            tiny(ids, use_cache=False)
            torch.cuda.synchronize(device)

        with torch.inference_mode():
            out[f"{label}_hooks_us"] = round(block_cpu_us(list(blocks_of(tiny)), forward, repeat=repeat), 3)
        by_depth = _by_depth(lambda m: _forward_ms(m.to(device, torch.bfloat16).eval(), ids), make)
        out[f"{label}_depth_us"] = round(_per_block_us(by_depth), 3)
    return out


def copy_timeline(handle, run, blocks, device: torch.device) -> dict | None:
    """One more forward of an applied prefetch plan with the runtime's copy statistics on: each copy's start and
    end and each stall's, in ms from the forward's start on the compute stream, the bytes copied, the late
    copies, the host time of the forward, and per block of ``blocks`` when the host issued it and when the GPU
    could start it (an event recorded after the runtime's own hooks: after its wait for the block's copy);
    None for a plan without prefetched layers or off a GPU."""
    offloader = handle.offloader
    if device.type != "cuda" or not hasattr(offloader, "history") or not offloader.layers:
        return None
    marks: list[tuple[float, object]] = []

    def mark(_module, _args) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        marks.append((time.perf_counter(), event))

    from runtime.stats import ForwardStats

    hooks = [b.register_forward_pre_hook(mark) for b in blocks]
    offloader.current = ForwardStats()  # late copies of the timed forwards are counted with stats off too
    offloader.collect_stats = True
    try:
        with torch.inference_mode():
            start = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            start.record()
            run()
            host_ms = (time.perf_counter() - t0) * 1e3
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
        forward = offloader.history[-1] if offloader.history else None
    finally:
        offloader.collect_stats = False
        for h in hooks:
            h.remove()
    if forward is None:
        return None
    blocks_at = [[round((t - t0) * 1e3, 3), round(start.elapsed_time(e), 3)] for t, e in marks]
    return dict(windows(forward, start), step_ms=round(start.elapsed_time(end), 3), host_ms=round(host_ms, 3),
                blocks=blocks_at)


def predicted_windows(plan, hw: HardwareProfile, tokens: int) -> list[list]:
    """The cost model's copy window and stall per prefetched layer of one forward: [layer, copy start, copy end,
    stall] in ms from the forward's start (None: no copy of it in the forward)."""
    def ms(t: float | None) -> float | None:
        return None if t is None else round(t, 3)

    return [[layer.name, ms(lt.copy_start), ms(lt.copy_end), ms(lt.stall)]
            for layer, lt in zip(plan.layers, timeline(plan, hw, tokens).layers) if layer.prefetch is not None]


def windows(forward, start) -> dict:
    """A forward's copy statistics (runtime/stats.py's ForwardStats: events per copy and per stall) as ms from
    the ``start`` event: [layer, start, end, bytes] per copy, [layer, start, end] per stall."""

    def at(event) -> float | None:
        return None if event is None else round(start.elapsed_time(event), 3)

    return {"bytes": forward.bytes, "late_copies": forward.late_copies,
            "copies": [[name, at(a), at(b), n] for name, a, b, n in forward.copies],
            "stalls": [[name, at(a), at(b)] for name, a, b in forward.stalls]}


def in_mode(workload: Workload, mode: str) -> Workload:
    """``workload`` with every item run in ``mode`` (eager, or graph: CUDA graph replay)."""
    return Workload({name: item.model_copy(update={"mode": mode}) for name, item in workload.items()})


def measured_routing(model, config, workload: Workload, device: torch.device) -> dict[str, dict[str, list[float]]]:
    """For an MoE model, per workload: each layer's experts' chance of being picked by a token, recorded on the
    very inputs the workload is timed with (``runtime.record_routing``); empty for a dense model. Random-weight
    routers do not route uniformly: a 2,048-token prompt reached about 38 of 128 experts a layer (2026-12-02)."""
    if not getattr(config, "num_experts", None):
        return {}
    routing = {}
    for name, item in workload.items():
        ids = inputs(name, item.tokens, config.vocab_size, device)
        with record_routing(model) as recorder, torch.inference_mode():
            model(ids, use_cache=False)
            routing[name] = recorder.stats("bench").shares()
    return routing


def sampled_shares(routing: dict[str, dict[str, list[float]]], name: str,
                   tokens: int) -> dict[str, list[float]] | None:
    """Workload ``name``'s recorded routing (``measured_routing``) where it estimates each expert's chance well
    enough to predict that workload with: at least ``MIN_CHOICES_PER_EXPERT`` choices an expert on average
    (schemas/routing.py says why); else None, uniform routing. One 32-token step (2 an expert of 128 at top-8) does
    not: predictions of UVA plans with it came out 0.82x at decode 32 on the H200, 0.97-0.98x with uniform
    routing, which 32 independent random tokens nearly follow (2026-12-02); a 2,048-token prompt (128 an expert)
    does."""
    shares = routing.get(name) or {}
    q = next(iter(shares.values()), [])
    return shares if q and tokens * sum(q) / len(q) >= MIN_CHOICES_PER_EXPERT else None


def touched_mean(shares: dict[str, list[float]], tokens: int) -> float:
    """The experts a layer is expected to touch at ``tokens`` under ``shares``, averaged over the layers."""
    return round(statistics.mean(touched_by(q, tokens)[0] for q in shares.values()), 2)


def make_plan(case: Case, spec, total: int, hw: HardwareProfile, workload: Workload):
    """The case's plan and a note when its budget had to be raised to the smallest feasible."""
    if case.vllm is not None:
        from planner.vllm.flags import parse_vllm_flags
        from planner.vllm.plan import from_vllm

        return from_vllm(spec, parse_vllm_flags(case.vllm), hardware=hw, workload=workload), None
    options = dict(case.options)
    if case.budget is not None:
        options["gpu_budget"] = int(total * case.budget)
    try:
        return planner.plan(spec, hardware=hw, workload=workload, **options), None
    except InfeasibleError as err:
        if err.min_gpu_budget is None:
            raise
        options["gpu_budget"] = err.min_gpu_budget
        return planner.plan(spec, hardware=hw, workload=workload, **options), f"budget raised to {err.min_gpu_budget}"


def link_bound_ms(plan, tokens: int, hw: HardwareProfile) -> float:
    """The plan's bytes over the host link at one forward: copies at the copy rate, UVA reads at the read rate."""
    once = {layer.name for layer in plan.layers if layer.prefetch is not None and layer.prefetch.once}
    return sum((0.0 if layer.name in once else w.copy_ms) + w.uva_link_ms
               for layer, w in zip(plan.layers, layers_work(plan.layers, tokens, hw)))


PLANS_FILE = "plans.jsonl"  # beside the rows: {"file": a row's plan_file, "yaml": the plan} a line


class Writer:
    def __init__(self, path: Path) -> None:
        self.file = path.open("w")

    def row(self, **data) -> None:
        self.file.write(json.dumps(data) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def run_model(kind: str, cases: list[Case], args, device, hw, workload, out: Writer, deadline: float,
              folder: Path) -> list[dict]:
    model, config = build_model(kind, args.dry_run, device)
    spec = runtime.describe(model, name=kind)
    total = sum(layer.nbytes for layer in spec.model.expanded())
    warm_up(model, config, workload, device, 0 if args.dry_run else WARMUP)  # a dry run checks the logic only
    cpu_row, model_hw = model_cpu(model, config, workload, device, hw, 1 if args.dry_run else 5)
    out.row(model=kind, **cpu_row)
    print(f"{kind:5} CPU per block: {cpu_row['model_us']:.1f} us on the model, {cpu_row['calibrate_us']:.1f} us "
          f"from calibrate; {cpu_row['outside_blocks_us']:.1f} us a decode step outside the blocks"
          + (f"; calibrate's tiny model now: {cpu_row['tiny_hooks_us']:.1f} us by hooks, {cpu_row['tiny_depth_us']:.1f} "
             f"by depths; with 128-wide heads {cpu_row['tiny_wide_heads_hooks_us']:.1f} and "
             f"{cpu_row['tiny_wide_heads_depth_us']:.1f}" if "tiny_hooks_us" in cpu_row else ""), flush=True)
    routing = measured_routing(model, config, workload, device)
    if routing:
        out.row(type="routing", model=kind, touched={name: touched_mean(shares, dict(workload.items())[name].tokens)
                                                     for name, shares in routing.items()},
                shares={name: {layer: [round(x, 7) for x in q] for layer, q in shares.items()}
                        for name, shares in routing.items()})  # bench/replay_predict.py predicts with them again
    graph = (args.graph or args.graph_only) and device.type == "cuda"
    modes = (["eager"] if not (args.graph_only and graph) else []) + (["graph"] if graph else [])
    names = [name for name, _ in workload.items()]
    plans = folder / PLANS_FILE  # every plan in one file: a device call returns a few files, not one a plan
    rows = []
    for i, case in enumerate(cases):
        if time.perf_counter() > deadline:
            out.row(type="skipped", model=kind, plan=case.label, reason="time budget")
            print(f"{kind:5} {case.label:52} skipped (time budget)", flush=True)
            continue
        try:
            plan, note = make_plan(case, spec, total, hw, workload)
            plan_file = f"{kind}-{i:02d}.plan.yaml"
            with plans.open("a") as saved:
                saved.write(json.dumps({"file": plan_file, "yaml": dump_model(plan)}) + "\n")
            predicted = {p.workload: p for p in plan.predictions.workloads}
            on_model = {p.workload: p for p in predict(plan, model_hw, workload).workloads}
            with runtime.apply(plan, model, device=str(device)) as handle:
                for (name, item), mode in ((w, mode) for w in workload.items() for mode in modes):
                    ids = inputs(name, item.tokens, config.vocab_size, device)
                    if mode == "graph":
                        if any(layer.experts is not None and layer.experts.cpu for layer in plan.layers):
                            out.row(type="graph_refused", model=kind, plan=case.label, workload=name,
                                    why="the host computes experts: no capture (runtime/cpu_experts.py)")
                            continue
                        late = getattr(getattr(handle.offloader, "current", None), "late_copies", None)
                        try:
                            run = graph_step(model, ids)
                        except RuntimeError as err:  # a diagnostic row: the plan's other rows still run
                            out.row(type="graph_error", model=kind, plan=case.label, workload=name,
                                    error=f"{type(err).__name__}: {str(err)[:300]}")
                            continue
                        p = q = predict(plan, hw, in_mode(workload, mode)).workloads[names.index(name)]
                    else:
                        run = lambda: model(ids, use_cache=False)  # noqa: E731
                        p, q = predicted[name], on_model[name]
                    ms = step_ms(run, device)
                    del run
                    # an MoE: predicted with what the run measured, the routing where it was well sampled (else
                    # uniform) and, eager, the model's own CPU figures
                    shares = sampled_shares(routing, name, item.tokens)
                    routed = (predict(plan, model_hw if mode == "eager" else hw, in_mode(workload, mode), shares)
                              .workloads[names.index(name)].step_ms if routing else None)
                    row = {"type": "row", "model": kind, "plan": case.label, "note": note, "plan_file": plan_file,
                           "mode": mode,
                           "backend": plan.summary.backend, "strategy": plan.summary.strategy,
                           "gpu_budget": plan.summary.gpu_budget_bytes, "peak_gpu_bytes": plan.summary.peak_gpu_bytes,
                           "offloaded_bytes": plan.summary.offloaded_bytes,
                           "offloaded_layers": plan.summary.offloaded_layers, "prefetch_step": plan.summary.prefetch_step,
                           "workload": name, "tokens": item.tokens, "predicted_ms": p.step_ms,
                           "measured_ms": round(ms, 6), "ratio": round(p.step_ms / ms, 4), "bound": p.bound,
                           "predicted_model_cpu_ms": q.step_ms, "ratio_model_cpu": round(q.step_ms / ms, 4),
                           "link_bound_ms": round(link_bound_ms(plan, item.tokens, hw), 3)}
                    if mode == "graph" and late is not None:  # copies made late (synchronously) in the capture
                        row["late_copies_in_capture"] = handle.offloader.current.late_copies - late
                    if routed is not None:  # predicted with the routing measured on these inputs (eager: and the
                        # CPU figures measured on the model)
                        row.update(predicted_routed_ms=routed, ratio_routed=round(routed / ms, 4))
                    out.row(**row)
                    rows.append(row)
                    print(f"{kind:5} {case.label:52} {name:8} {mode:5} predicted {p.step_ms:9.2f} ms  measured "
                          f"{ms:9.2f} ms  x{p.step_ms / ms:5.3f}  ({p.bound}; CPU from the model x{q.step_ms / ms:5.3f}"
                          + (f"; measured routing x{routed / ms:5.3f}" if routed is not None else "") + ")",
                          flush=True)
                    if item.tokens <= 32 and mode == "eager":  # where the copies and the CPU's issue overlap: the timeline as it ran
                        try:
                            seen = copy_timeline(handle, lambda: model(ids, use_cache=False), blocks_of(model), device)
                        except Exception as err:  # noqa: BLE001 - a diagnostic never costs the measurements
                            out.row(type="timeline_error", model=kind, plan=case.label, workload=name,
                                    error=f"{type(err).__name__}: {err}")
                            seen = None
                        if seen is not None:
                            out.row(type="timeline", model=kind, plan=case.label, workload=name,
                                    predicted=predicted_windows(plan, hw, item.tokens), **seen)
        except (PlannerError, RuntimeError, ValueError) as err:
            out.row(type="error", model=kind, plan=case.label, error=f"{type(err).__name__}: {err}",
                    trace=traceback.format_exc(limit=3))
            print(f"{kind:5} {case.label:52} error: {type(err).__name__}: {err}", flush=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def summary(rows: list[dict], key: str = "ratio") -> dict:
    """How many pairs and plans are predicted within 10%, by ``key`` (ratio: with calibrate's profile;
    ratio_model_cpu: with the CPU per block measured on the model)."""
    ratios = [r[key] for r in rows]
    within = [r for r in rows if abs(r[key] - 1) <= 0.10]
    plans = {(r["model"], r["plan"]) for r in rows}
    plans_within = {p for p in plans if all(abs(r[key] - 1) <= 0.10 for r in rows if (r["model"], r["plan"]) == p)}
    return {"type": "summary", "ratio": key, "plans": len(plans), "pairs": len(rows),
            "pairs_within_10pct": len(within), "plans_all_within_10pct": len(plans_within),
            "median_ratio": round(statistics.median(ratios), 4) if ratios else None,
            "worst": sorted(({"model": r["model"], "plan": r["plan"], "workload": r["workload"], "ratio": r[key]}
                             for r in rows), key=lambda r: -abs(r["ratio"] - 1))[:8]}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    start = time.perf_counter()
    device = torch.device(args.device)
    folder = out_folder(args)
    out = Writer(folder / "predict-h200.jsonl")
    try:
        out.row(type="env", date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                argv=sys.argv, torch=torch.__version__, dry_run=args.dry_run,
                device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
        if args.profile or device.type != "cuda":
            hw = load_hardware(args.profile or "h200")
        else:
            from runtime.calibrate import calibrate

            hw, raw = calibrate(device, "h200-calibrated")
            link = raw["raw_link"]
            out.row(type="link", **link, copy_gbps=link["bytes"] / link["copy_ms"] / 1e6,
                    read_gbps=link["bytes"] / link["read_ms"] / 1e6, both_gbps=hw.link_shared_gbps,
                    sum_of_alone_ms=link["copy_ms"] + link["read_ms"])
            print(f"link: copy {link['copy_ms']:.1f} ms, UVA read {link['read_ms']:.1f} ms, both {link['both_ms']:.1f} ms "
                  f"({hw.link_shared_gbps:.1f} GB/s together)", flush=True)
            out.row(type="steady", **raw["steady"])  # the link at calibrate's start and end
            if raw["steady"]["unsteady"]:
                print(f"warning: {raw['steady']['unsteady']}", flush=True)
            (folder / "predict-h200.profile.yaml").write_text(dump_model(hw))
        out.row(type="profile", profile=hw.model_dump(), seconds=round(time.perf_counter() - start, 1))
        workload = DRY_WORKLOADS if args.dry_run else WORKLOADS
        kinds = [args.only] if args.only else list(MODELS)
        (folder / PLANS_FILE).write_text("")  # run_model appends each model's plans: none of an earlier run's
        rows: list[dict] = []
        for i, kind in enumerate(kinds):
            left = args.time_budget - (time.perf_counter() - start)
            deadline = time.perf_counter() + left / (len(kinds) - i)  # each model its share of what is left
            cases = [c for c in PLANS if c.model == kind][:args.limit]
            rows += run_model(kind, cases, args, device, hw, workload, out, deadline, folder)
        for mode in ("eager", "graph"):
            chosen = [r for r in rows if r["mode"] == mode]
            for key in ("ratio", "ratio_model_cpu", "ratio_routed"):
                if not chosen or (key == "ratio_model_cpu" and mode == "graph"):
                    continue
                with_key = [{**r, key: r.get(key, r["ratio"])} for r in chosen]  # a dense model: no routing
                result = {**summary(with_key, key), "mode": mode}
                result["seconds"] = round(time.perf_counter() - start, 1)
                out.row(**result)
                print(json.dumps(result), flush=True)
    finally:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
