"""MoE past one link (issue 21) on the H200: routed experts shared between the host CPU and the link (the cpu
backend) and hot experts kept on the GPU from measured routing, against the plans that read every offloaded
expert through UVA.

    PYTHONPATH=. python bench/bench_moe_hybrid.py --out $OUT/moe-hybrid.jsonl     # the H200 run (3-4 min)
    python bench/bench_moe_hybrid.py --dry-run --out /tmp/moe-hybrid.jsonl          # tiny shapes on the CPU

Models (transformers, random bf16 weights built on the GPU, the profile the bundled h200):

- the Qwen3-MoE shape of bench_cost (24 layers, 128 experts of width 768, top-8, 31 GB) at 12 GB;
- the Phi-3.5-MoE shape (``PhimoeForCausalLM``: hidden 4096, 16 experts of width 6,400, top-2, 8 of its 32 layers,
  22 GB) at 8 GB: an architecture in no other file of this repository.

Per model, uniform routing (the random routers), three plans that offload the routed experts only:
``uva`` (every offloaded expert read through UVA, as bench_cost's "experts on uva"), ``hybrid`` (``--backends
routed_experts=cpu`` planned for a decode step at batch 32: each offloaded layer's experts shared between the host
and the link) ``auto prefill`` (the default plan for a 2,048-token prefill, measured there) and ``auto decode32`` (the default
plan for decode at batch 32, measured there: does auto take the hybrid where it is fastest?); each measured at decode batch 32, prefill
2,048 and decode batch 1, eager (CUDA events around the forward, median), with the plan's prediction for the same
workload and the distinct experts each layer's router touched.

Skewed routing (Qwen3-MoE): every router's logits get a bias on a fifth of the experts, the bias chosen so that
they receive about 80% of the choices (the histogram of the shares is a row); the routing of sample decode steps
is recorded (``runtime.record_routing``, written under $OUT as ``routing-skewed.yaml``); at a budget of the
non-expert bytes plus 25% of the expert bytes, ``uva`` against ``hot`` (``--routing``: the most used experts on
the GPU, the rest through UVA) and ``hot+cpu`` (the rest shared with the host) at decode batch 1, eager and in CUDA
graph replay (not ``hot+cpu``: its host part refuses capture), with the bytes each decode step reads over the link
(the experts its routing touched that are not on the GPU, from a recording of that step).

Before the models, the host's figures are measured on this machine as ``planner calibrate`` measures them
(``runtime.calibrate_host``: a row ``host_figures``, against the bundled profile's, which every plan and prediction
uses: they were fitted to the host's time in the forwards of the 2026-12-01 run on this machine kind). Each hybrid
plan's rows also carry the host thread's time per layer in one forward (``host_ms_per_layer``: median and
total) and, for decode at batch 32, how far its logits are from the resident model's (the model before apply)
next to how far transformers' two expert implementations are from each other (``exactness``).

``--cases decode32`` (and ``--only``) measure part of it: ``--only qwen3_moe --only phimoe --cases decode32 --cases
decode1`` took 87 s on the H200 (2026-12-01, bench/results/hybrid-h200-2026-12-01/); the whole run, prefill and
the skewed part added, is expected at 3-4 minutes (not timed since these changes).

Each row is a JSON line on stdout and in --out; rows have ``predicted_ms``, ``measured_ms`` and their ratio, and
eager rows the prediction with the resident model's own CPU figures measured in the run (an ``own_cpu`` row per
model, read as bench_predict_h200's ``own_cpu_figures``; ``predicted_model_cpu_ms``, ``ratio_model_cpu``): at batch 1 an eager step is the host's issue time, which
moves between runs more than the 15% the predictions are held to.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_cost import random_model, timer  # noqa: E402
from compare_run import graph as graph_step  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
from runtime import expert_math, host_matmul, pinned  # noqa: E402
from planner.cost.predict import predict  # noqa: E402
from schemas.kinds import param_kind  # noqa: E402
from runtime.routing import record_routing  # noqa: E402
from runtime.experts_forward import ExpertsForward  # noqa: E402
from schemas.hardware import load_hardware  # noqa: E402
from schemas.hardware_profile import HostRatePoint  # noqa: E402
from schemas.io import dump_model, load_routing  # noqa: E402
from schemas.routing import RoutingRef  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

WEIGHTS_ONLY = {"workspace": 0, "activations": 0, "graphs": 0}  # a dry run's tiny budgets: weights alone

GB = 10**9
HOST_LEVEL_KEYS = ("planned", "now", "moved_calls", "all_uva_calls", "more_calls")  # HostGuard.summary's, summed
HOST_JUDGED_KEYS = ("gpu_ms", "host_ms", "handoff_ms")  # HostGuard.summary's, the median layer's
EXACT_SEEDS = tuple(range(5, 13))  # decode-32 inputs the logits are compared on: 256 positions (--exact-batches)


def _position_maxima(outs: list, refs: list) -> list[float]:
    """Each position's largest |logit difference| over the vocabulary, every batch's positions in turn."""
    return [v for out, ref in zip(outs, refs) for v in (out - ref).abs().amax(-1).flatten().tolist()]


def _quantiles(values: list[float]) -> dict[str, float]:
    """The spread of per-position maxima: a maximum over 256 positions is one extreme draw, these are steadier."""
    ranked = sorted(values)
    at = lambda q: ranked[min(len(ranked) - 1, int(q * len(ranked)))]  # noqa: E731
    return {"mean": round(statistics.mean(ranked), 5), "median": round(at(0.5), 5), "p90": round(at(0.9), 5),
            "p99": round(at(0.99), 5), "max": round(ranked[-1], 5)}
SETTLE = 40  # forwards before a guarded host plan is timed: its levels move a call after each measured one
QWEN = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=32,
            num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
            decoder_sparse_step=1, mlp_only_layers=[])
PHI = dict(vocab_size=32064, hidden_size=4096, intermediate_size=6400, num_hidden_layers=8, num_attention_heads=32,
           num_key_value_heads=8, num_local_experts=16, num_experts_per_tok=2)
TINY_QWEN = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, num_experts=10, num_experts_per_tok=2, moe_intermediate_size=16,
                 decoder_sparse_step=1, mlp_only_layers=[])
TINY_PHI = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, num_local_experts=8, num_experts_per_tok=2)
BUDGETS = {"qwen3_moe": 12 * GB, "phimoe": 8 * GB}
HOT_SHARE, HOT_TARGET = 0.2, 0.8
HOT_TOLERANCE, BISECTIONS = 0.02, 8  # how near the target the bias search stops, and its most halvings
CASES = ("decode32", "prefill", "decode1")
TURN_TOKENS = 8  # the distinct one-token inputs the side-by-side turns cycle over (``in_turn``)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.dry = args.dry_run
        self.device = torch.device("cpu" if self.dry else args.device)
        self.out = open(args.out, "w")
        self.folder = Path(args.out).parent
        self.hw = load_hardware(args.profile)
        if self.dry:  # a fast host and a slow link, so that the tiny plans give the host experts and the run exercises it
            self.hw = self.hw.model_copy(update={"host_call_us": 1.0, "host_expert_us": 0.0, "uva_gbps": 0.01,
                                                 "moe_block_cpu_us": 1.0, "host_expert_gbps": [HostRatePoint(tokens=1,
                                                                                                             gbps=500.0)]})
            torch.set_num_threads(1)  # tiny matmuls: threads only contend
        self.prefill = 48 if self.dry else 2048
        self.repeat = 1 if self.dry else 5
        self.warmup = 0 if self.dry else 2
        self.cases = set(args.cases or CASES)
        self.default_waste = expert_math.JOIN_WASTE
        self.join_wastes = getattr(args, "join_waste", None) or [self.default_waste]
        self.host_shares = getattr(args, "host_share", None) or []
        self.host_threads = getattr(args, "host_threads", None) or []
        self.host_pages = getattr(args, "host_pages", None) or []
        self.host_in_out = getattr(args, "host_in_out", None) or []
        self.host_kernels = getattr(args, "host_kernel", None) or []
        self.switch_intervals = getattr(args, "switch_interval", None) or []
        self.host_guards = getattr(args, "host_guard", None) or []
        self.own_host_figures = getattr(args, "own_host_figures", False)
        # a profile ``planner calibrate`` measured on this machine: every prediction is also made with it
        calibrated = getattr(args, "calibrated", None)
        self.calibrated = load_hardware(calibrated) if calibrated else None
        self.levels_exactness = getattr(args, "exact_levels", False)
        self.exact_batches = getattr(args, "exact_batches", None) or len(EXACT_SEEDS)
        self.turn_rounds = getattr(args, "turn_rounds", None) or 5
        self.turns_only = getattr(args, "turns_only", False)
        self.references: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> ``exactness``'s compare
        self.host_figures: dict = {}  # the host's figures measured in this run (``calibrate_host``)
        self.cpu_figures: dict[str, float] = {}  # the resident model's own CPU figures (``own_cpu``)

    def calibrate_host(self) -> None:
        """The host's figures measured here, beside the profile's (not in the dry run: its tiny models need the
        fast host it sets)."""
        if self.dry:
            return
        from runtime.calibrate_host import host_experts

        def rounded(figures: dict) -> dict:
            return {k: ([p.model_dump() for p in v] if isinstance(v, list) else round(v, 3)) for k, v in figures.items()}

        figures = self.host_figures = host_experts(self.device)
        self.emit(host_figures=rounded(figures), profile_host_figures=rounded(
            {k: getattr(self.hw, k) for k in figures}), host_kernel=host_matmul.KERNEL,
            host_kernel_defines=list(host_matmul.DEFINES), host_kernel_built=host_matmul.library() is not None)
        if "off" in self.host_kernels and host_matmul.KERNEL:  # the same figures through torch.bmm, beside them
            with setting(host_matmul, "KERNEL", False):
                self.emit(host_figures=rounded(host_experts(self.device)), host_kernel=False)

    def emit(self, **row) -> None:
        line = json.dumps(row, default=str)
        print(line, flush=True)
        self.out.write(line + "\n")
        self.out.flush()

    def build(self, kind: str):
        import transformers

        tiny = self.dry
        cls, config = {
            "qwen3_moe": (transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(**(TINY_QWEN if tiny else QWEN))),
            "phimoe": (transformers.PhimoeForCausalLM, transformers.PhimoeConfig(**(TINY_PHI if tiny else PHI))),
        }[kind]
        return random_model(cls, config, self.device), config

    def ids(self, shape: tuple[int, int], vocab: int, seed: int = 1) -> torch.Tensor:
        return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed)).to(self.device)

    def time_ms(self, fn, tokens: int) -> float:
        """Median ms: CUDA events on the GPU, the wall clock on the CPU (bench_cost's timer); fewer runs of a
        prefill (seconds each through UVA)."""
        long = tokens >= 1024
        return timer(self.device, fn, 3 if long else self.repeat, min(1, self.warmup) if long else self.warmup)

    # -- plans ------------------------------------------------------------------------------------------
    def plan(self, spec, budget: int, tokens: int, hardware=None, **options):
        """The plan of ``spec`` at ``budget`` for a step of ``tokens``, made with ``hardware`` (default the run's
        profile)."""
        workload = Workload({"step": WorkloadItem(tokens=tokens)})
        if self.dry:  # tiny models: their budgets are about weights (no workspace or activations counted)
            spec = spec.model_copy(update={"memory": spec.memory.model_copy(update=WEIGHTS_ONLY)})
        return planner.plan(spec, gpu_budget=budget, hardware=hardware or self.hw, workload=workload, **options)

    def predicted(self, plan, tokens: int, mode: str = "eager", shares=None, own_cpu: bool = False,
                  calibrated: bool = False) -> float:
        """The plan's predicted step: with the profile plans are made with, with the resident model's CPU figures
        measured in this run in its place (``own_cpu``), or with ``--calibrated``'s profile (``calibrated``)."""
        workload = Workload({"step": WorkloadItem(tokens=tokens, mode=mode)})
        hw = self.calibrated if calibrated else self.hw.model_copy(update=self.cpu_figures) if own_cpu else self.hw
        return predict(plan, hw, workload, shares).workloads[0].step_ms

    def own_cpu(self, model, config, kind: str) -> None:
        """The resident model's host time a decoder block and outside its blocks at an eager decode step, measured
        now (bench_predict's ``model_cpu``): eager rows are also predicted with them (``predicted_model_cpu_ms``), as the host's issue speed
        moves between runs (an all-UVA eager step of the same plan took 37.6 to 70.0 ms on 2026-12-02)."""
        from bench_predict_h200 import model_cpu, own_cpu_figures

        workload = Workload({"decode": WorkloadItem(tokens=1)})
        row, _ = model_cpu(model, config, workload, self.device, self.hw, repeat=1 if self.dry else 5)
        self.cpu_figures = own_cpu_figures(row)
        self.emit(model=kind, own_cpu={k: v for k, v in row.items() if k != "type"})

    def measure(self, model_name: str, label: str, plan, model, config, cases, shares=None, graph: bool = False,
                link: dict | None = None, host_threads: int | None = None, host_levels: bool = True,
                expert_graphs: bool = True) -> None:
        """Apply ``plan``, time each case (name, input shape), remove."""
        cases = [c for c in cases if c[0] in self.cases]
        if not cases:
            return
        hybrid = any(layer.experts is not None and layer.experts.cpu for layer in plan.layers)
        exact = self.exactness(model, config) if hybrid and any(c[0] == "decode32" for c in cases) else None
        t0 = time.perf_counter()
        handle = runtime.apply(plan, model, device=str(self.device), host_threads=1 if self.dry else host_threads,
                               host_levels=host_levels, expert_graphs=expert_graphs)
        applied_s = time.perf_counter() - t0
        try:
            for name, shape in cases:
                ids = self.ids(shape, config.vocab_size)
                modes = ["eager"] + (["graph"] if graph and self.device.type == "cuda" else [])
                for mode, waste in [(m, w) for m in modes for w in (self.join_wastes if hybrid else [None])]:
                    if waste is not None:
                        expert_math.JOIN_WASTE = waste
                    step = (lambda: model(ids, use_cache=False)) if mode == "eager" else graph_step(model, ids)
                    if hybrid and handle._splits.guards and not self.dry:
                        for _ in range(SETTLE):  # the host guard's levels settle (runtime/host_guard.py)
                            step()
                    tokens = shape[0] * shape[1]
                    ms = self.time_ms(step, tokens)
                    recorded = self.recorded(model, ids)  # the routing this input takes: one forward a row
                    p = self.predicted(plan, tokens, mode, shares)
                    own = self.predicted(plan, tokens, mode, shares, own_cpu=True) if self.cpu_figures else None
                    row = {"model": model_name, "plan": label, "backend": plan.summary.backend, "workload": name,
                           "tokens": tokens, "mode": mode, "measured_ms": round(ms, 3), "predicted_ms": p,
                           "ratio": round(p / ms, 4), "peak_gpu_bytes": plan.summary.peak_gpu_bytes,
                           "offloaded_bytes": plan.summary.offloaded_bytes, "apply_s": round(applied_s, 1),
                           "experts_touched": self.touched(recorded)}
                    if shares is None:  # uniform above; also the routing this very input takes, where well sampled
                        routed = self.routed(recorded, tokens)
                        if routed is not None:
                            r = self.predicted(plan, tokens, mode, routed)
                            row.update(predicted_routed_ms=r, ratio_routed=round(r / ms, 4),
                                       shares={layer: [round(x, 7) for x in q] for layer, q in routed.items()})
                    if own is not None and mode == "eager":
                        row.update(predicted_model_cpu_ms=own, ratio_model_cpu=round(own / ms, 4))
                    if self.calibrated is not None:
                        c = self.predicted(plan, tokens, mode, shares, calibrated=True)
                        row.update(predicted_calibrated_ms=c, ratio_calibrated=round(c / ms, 4))
                    if mode == "eager" and handle._splits is not None:  # runtime/shape_graphs.py
                        row["expert_graphs"] = handle.stats().get("expert_graphs", expert_graphs)
                    if link is not None:
                        row["link_bytes_per_step"] = self.link_bytes(plan, recorded, link)
                    if hybrid and mode == "eager":
                        row["host_ms_per_layer"] = host_times(model, ids)
                        row["join_waste"] = waste
                        levels = handle._splits.host_levels().values()
                        row["host_guard"] = host_levels
                        row["host_experts"] = {key: sum(x[key] for x in levels) for key in HOST_LEVEL_KEYS}
                        row["host_experts"]["levels"] = [x["now"] for x in levels]
                        row["host_experts"]["judged_ms"] = {  # the median layer's last judged call (HostGuard.summary)
                            key: round(statistics.median(x[key] for x in levels), 3) if levels else None
                            for key in HOST_JUDGED_KEYS}
                    if exact is not None and name == "decode32":
                        row["exactness"] = exact(model)
                    self.emit(**row)
        finally:
            handle.remove()
            expert_math.JOIN_WASTE = self.default_waste

    def in_turn(self, model_name: str, model, config, turns: list[tuple[str, object, dict, object]],
                rounds: int = 5) -> None:
        """Eager decode steps at batch 1 of several applied plans in turn (each turn: apply ``(label, plan, apply
        options, routing shares)``, three steps, ``self.repeat`` timed, remove), ``rounds`` rounds: each turn's step
        GPU span (CUDA events) and the issuing thread's time to return from the forward (its Python and launches),
        medians over the rounds and each turn's ratio to the first's, and per round to each turn whose label starts
        with ``uva`` (the all-UVA plan with and without its layer graphs). Eager steps of one plan spread by 20-75%
        from one measurement to the next on the H200's host (2026-12-03): only turns taken side by side compare.
        Each turn applied with ``apply``'s defaults also has its prediction (``predicted_ms``, and with the run's own
        CPU figures ``predicted_model_cpu_ms``; the planner assumes the defaults). In the first round's turns with
        split layers, also one split layer's experts call alone (``one_layer_call_us``).

        The steps cycle over ``TURN_TOKENS`` distinct one-token inputs, one timing a cycle (the span a step is its
        time / ``TURN_TOKENS``), as a decode's tokens differ from step to step: one input repeated routes to the same
        experts every step, a sample of one routing (PhiMoE's 8 layers at top-2 of 16: whether a layer's two experts
        are both in host memory, one or none moves its host part 2x). ``predicted_routed_ms``: each turn predicted
        with the routing those inputs take (recorded on the resident model before the turns)."""
        if "decode1" not in self.cases:
            return
        inputs = [self.ids((1, 1), config.vocab_size, seed=1 + i) for i in range(TURN_TOKENS)]
        with record_routing(model) as recorder, torch.inference_mode():
            for ids in inputs:
                model(ids, use_cache=False)
            stats = recorder.stats(model_name, f"bench_moe_hybrid: the {TURN_TOKENS} one-token inputs of the turns")
        routed = stats.shares()
        path = self.folder / f"routing-turns-{model_name.replace(' ', '-')}.yaml"  # to predict the turns again with
        path.write_text(dump_model(stats))
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        taken: dict[str, list[dict]] = {label: [] for label, _, _, _ in turns}
        row = {"model": model_name, "plan": "in turn: " + ", ".join(taken), "workload": "decode1", "mode": "eager"}
        row["predicted_ms"] = {label: self.predicted(plan, 1, "eager", shares)
                               for label, plan, options, shares in turns if not options}
        if self.cpu_figures:
            row["predicted_model_cpu_ms"] = {label: self.predicted(plan, 1, "eager", shares, own_cpu=True)
                                             for label, plan, options, shares in turns if not options}
        if self.calibrated is not None:
            row["predicted_calibrated_ms"] = {label: self.predicted(plan, 1, "eager", shares, calibrated=True)
                                              for label, plan, options, shares in turns if not options}
        for key, kwargs in (("predicted_routed_ms", {}), ("predicted_calibrated_routed_ms", {"calibrated": True})):
            if key == "predicted_routed_ms" or self.calibrated is not None:
                row[key] = {label: self.predicted(plan, 1, "eager", routed, **kwargs)
                            for label, plan, options, _ in turns if not options}
        row["inputs"], row["inputs_routing"] = TURN_TOKENS, path.name
        for r in range(1 if self.dry else rounds):
            for label, plan, options, _ in (turns if r % 2 == 0 else turns[::-1]):  # a drift favours no turn
                handle = runtime.apply(plan, model, device=str(self.device), **options)
                try:
                    issue = []

                    def step(ids):
                        t = time.perf_counter()
                        model(ids, use_cache=False)
                        issue.append((time.perf_counter() - t) * 1e3)

                    def cycle():
                        for ids in inputs:
                            step(ids)

                    with torch.inference_mode():
                        for i in range(3):  # a shape's second call captures its graphs
                            step(inputs[i % TURN_TOKENS])
                        if handle._splits is not None and handle._splits.guards and not self.dry:
                            for i in range(SETTLE):  # the host guard's levels settle (runtime/host_guard.py)
                                step(inputs[i % TURN_TOKENS])
                        sync()
                    span = self.time_ms(cycle, 1) / TURN_TOKENS
                    taken[label].append({"span_ms": round(span, 3), "issue_ms": round(
                        statistics.median(issue[-self.repeat * TURN_TOKENS:]), 3)})
                    if r == 0 and handle._splits is not None and options.get("expert_graphs", True):
                        row.setdefault("one_layer_call_us", self._one_layer(handle._splits.forwards[0][2], config,
                                                                            sync))
                    if r == 0 and handle._splits is None and options.get("expert_graphs", True):
                        tall = [m.forward for m in model.modules() if isinstance(m.__dict__.get("forward"),
                                                                                 ExpertsForward) and m.forward.tall]
                        if tall:
                            row.setdefault("one_uva_layer_call_us", self._one_uva_layer(tall[0], config, sync))
                finally:
                    handle.remove()
        first = turns[0][0]
        for key in ("span_ms", "issue_ms"):
            med = {label: statistics.median(t[key] for t in got) for label, got in taken.items()}
            row[key] = {label: {"median": round(m, 3), f"/ {first}": round(m / med[first], 4)}
                        for label, m in med.items()}
        # each round's ratio to the first turn's (the two taken a few seconds apart), and their median
        row["span_ratio_per_round"] = {label: [round(t["span_ms"] / f["span_ms"], 4) for t, f in zip(got, taken[first])]
                                       for label, got in taken.items() if label != first}
        row["span_ratio_median"] = {label: round(statistics.median(v), 4)
                                    for label, v in row["span_ratio_per_round"].items()}
        row["span_ratio_median_to"] = {
            ref: {label: round(statistics.median(t["span_ms"] / f["span_ms"] for t, f in zip(got, taken[ref])), 4)
                  for label, got in taken.items() if label != ref}
            for ref in taken if ref.startswith("uva")}
        row["turns"] = taken
        self.emit(**row)

    def _one_uva_layer(self, forward, config, sync) -> dict:
        """Microseconds a call of one experts module read through UVA takes the issuing thread (200 calls, then the
        device's sync), as launched (its own forward) and from its graph, at one token routed to its first k
        experts (read over the link each call)."""
        k = config.num_experts_per_tok
        hidden = torch.randn(1, config.hidden_size, dtype=torch.bfloat16, device=self.device)
        index = torch.arange(k, device=self.device).view(1, k)
        weights = torch.full((1, k), 1.0 / k, dtype=torch.bfloat16, device=self.device)
        return self._calls({"graph": forward.graphs, "launched": forward.own, "graph again": forward.graphs},
                           (hidden, index, weights), sync)

    def _calls(self, calls: dict, inputs: tuple, sync) -> dict:
        """Per labelled call (None: left out): microseconds a call takes the issuing thread (``issue_us``) and until
        the device is done (``done_us``), over 200 calls after 3."""
        out = {}
        for label, call in calls.items():
            if call is None:
                continue
            with torch.inference_mode():
                for _ in range(3):
                    call(*inputs)
                sync()
                t = time.perf_counter()
                for _ in range(200):
                    call(*inputs)
                issued = time.perf_counter() - t
                sync()
                done = time.perf_counter() - t
            out[label] = {"issue_us": round(issued / 200 * 1e6, 1), "done_us": round(done / 200 * 1e6, 1)}
        return out

    def _one_layer(self, forward, config, sync) -> dict:
        """Microseconds a call of one split layer's experts forward takes the issuing thread (200 calls, then the
        device's sync), launched (``gpu_rows``) and from its graph (``graphs``), its tokens routed to experts in GPU
        memory (no link reads: the call's own issue time)."""
        placement = forward.placement
        on_gpu = (placement.host_place >= len(placement.ids)).nonzero().flatten()
        k = config.num_experts_per_tok
        if on_gpu.numel() < k:
            return {}
        hidden = torch.randn(1, config.hidden_size, dtype=torch.bfloat16, device=self.device)
        index = on_gpu[:k].view(1, k).to(self.device)
        weights = torch.full((1, k), 1.0 / k, dtype=torch.bfloat16, device=self.device)
        return self._calls({"graph": forward.graphs, "launched": forward.gpu_rows, "graph again": forward.graphs},
                           (hidden, index, weights), sync)

    def resident(self, model_name: str, plan, model, config, shape: tuple[int, int]) -> None:
        """The model with no plan, eager and in graph replay, beside the plans: the floor of an eager decode (at batch
        1 transformers' Python issues a step of the Qwen3-MoE shape in about as long as the link reads what the
        all-UVA plan reads, so the eager ratio of a plan to the all-UVA plan cannot fall below this row's)."""
        ids = self.ids(shape, config.vocab_size)
        modes = ["eager"] + (["graph"] if self.device.type == "cuda" else [])
        for mode in modes:
            step = (lambda: model(ids, use_cache=False)) if mode == "eager" else graph_step(model, ids)
            tokens = shape[0] * shape[1]
            ms, p = self.time_ms(step, tokens), self.predicted(plan, tokens, mode)
            row = dict(model=model_name, plan="resident", workload="decode1", tokens=tokens, mode=mode,
                       measured_ms=round(ms, 3), predicted_ms=p, ratio=round(p / ms, 4),
                       offloaded_bytes=plan.summary.offloaded_bytes)
            if self.cpu_figures and mode == "eager":
                own = self.predicted(plan, tokens, mode, own_cpu=True)
                row.update(predicted_model_cpu_ms=own, ratio_model_cpu=round(own / ms, 4))
            if self.calibrated is not None:
                c = self.predicted(plan, tokens, mode, calibrated=True)
                row.update(predicted_calibrated_ms=c, ratio_calibrated=round(c / ms, 4))
            self.emit(**row)

    def exactness(self, model, config):
        """The resident model's logits at decode batch 32 on ``EXACT_SEEDS`` inputs (before apply), and how far
        transformers' per-expert loop is from its grouped kernel on the same inputs; returns what compares an
        applied model's logits with them. Both sides take the max over every position (the issue's tolerance: two
        GPU implementations of the same experts), and each batch's max is kept to show their spread; the two kernels'
        top-1 agreement is kept beside the plan's (random weights leave near ties that either rounding flips). Made once a
        model (``remove()`` gives its weights back bit for bit, so later plans compare with the same references)."""
        made = self.references.get(model)
        if made is not None:
            return made
        seeds = EXACT_SEEDS[:1] if self.dry else tuple(range(EXACT_SEEDS[0], EXACT_SEEDS[0] + self.exact_batches))
        batches = [self.ids((32, 1), config.vocab_size, seed=s) for s in seeds]
        with torch.inference_mode():
            refs = [model(ids, use_cache=False).logits.float() for ids in batches]
            pair = pair_top1 = pair_positions = None
            if hasattr(model, "set_experts_implementation"):
                model.set_experts_implementation("eager")
                loops = [model(ids, use_cache=False).logits.float() for ids in batches]
                model.set_experts_implementation("grouped_mm")
                pair = [(loop - ref).abs().max().item() for loop, ref in zip(loops, refs)]
                pair_positions = _position_maxima(loops, refs)
                pair_top1 = statistics.mean((loop.argmax(-1) == ref.argmax(-1)).float().mean().item()
                                            for loop, ref in zip(loops, refs))
                del loops

        def compare(applied) -> dict:
            diffs, agree, outs = [], [], []
            with torch.inference_mode():
                for ids, ref in zip(batches, refs):
                    out = applied(ids, use_cache=False).logits.float()
                    diffs.append((out - ref).abs().max().item())
                    agree.append((out.argmax(-1) == ref.argmax(-1)).float().mean().item())
                    outs.append(out)
            positions = _position_maxima(outs, refs)
            row = {"max_abs_diff": round(max(diffs), 5), "tolerance": round(max(pair), 5) if pair else None,
                   "top1_agree": round(statistics.mean(agree), 4), "positions": 32 * len(batches),
                   "tolerance_top1_agree": round(pair_top1, 4) if pair else None,
                   "batch_max_abs_diff": [round(d, 5) for d in diffs],
                   "batch_tolerance": [round(d, 5) for d in pair] if pair else None,
                   "position_max": _quantiles(positions)}
            if pair_positions is not None:
                row["tolerance_position_max"] = _quantiles(pair_positions)
                median = statistics.median(pair_positions)
                row["positions_above_pair_median"] = round(statistics.mean(p > median for p in positions), 4)
            return row

        self.references[model] = compare
        return compare

    def exact_levels(self, kind: str, plan, model, config) -> None:
        """``plan`` applied with every split layer held at one level of runtime/cpu_experts.py's ``_Placement`` (none
        of its host-memory experts on the host, half the plan's, the plan's, every one) and its logits against the
        resident model's at each: is the difference the count of rows the host rounds, or the noise of a forward?"""
        compare = self.exactness(model, config)
        levels = {"none": lambda p: 0, "half": lambda p: p.planned // 2, "plan": lambda p: p.planned,
                  "all": lambda p: p.most}
        for name, level in levels.items():
            handle = runtime.apply(plan, model, device=str(self.device), host_threads=1 if self.dry else None,
                                   host_levels=False)  # no guard: each layer computes its placement's ``planned``
            try:
                held = 0
                for _, _, forward in handle._splits.forwards:
                    forward.placement.planned = level(forward.placement)
                    held += forward.placement.planned
                self.emit(model=kind, plan="hybrid", level=name, host_experts=held, exactness=compare(model))
            finally:
                handle.remove()

    def recorded(self, model, ids):
        """The routing ``model`` takes on ``ids`` (``runtime.record_routing``, one forward): what ``touched``,
        ``routed`` and ``link_bytes`` read."""
        with record_routing(model) as recorder, torch.inference_mode():
            model(ids, use_cache=False)
            return recorder.stats("x")

    def touched(self, stats) -> dict:
        hit = [sum(1 for c in layer.counts if c) for layer in stats.layers]
        return {"per_layer_mean": round(statistics.mean(hit), 2), "experts": stats.layers[0].experts}

    def routed(self, stats, tokens: int) -> dict[str, list[float]] | None:
        """Each layer's experts' chances of being picked in ``stats``, where they estimate that workload well
        (bench_predict_h200's ``sampled_shares``: a 2,048-token prompt does, a 32-token step does not); None
        otherwise. Random-weight routers do not route uniformly: a 2,048-token prompt of the Qwen3-MoE shape reached
        about 38 of 128 experts a layer (2026-12-02)."""
        from bench_predict_h200 import sampled_shares

        return sampled_shares({"step": stats.shares()}, "step", tokens)

    def link_bytes(self, plan, stats, per_expert: dict[str, int]) -> int:
        """Bytes one forward reads over the link: the experts its routing (``stats``) touched that live in host
        memory."""
        stats = stats.by_layer()
        total = 0
        for layer in plan.layers:
            r = stats.get(layer.name)
            if r is None or not layer.offloaded:
                continue
            on_gpu = set(layer.experts.gpu) if layer.experts is not None else set()
            experts_off = layer.experts is not None or any(
                param_kind(layer.name, rel, layer.params[rel].kind) == "routed_experts" for rel in layer.offloaded)
            if experts_off:
                total += sum(1 for e, c in enumerate(r.counts) if c and e not in on_gpu) * per_expert[layer.name]
        return total

    def emit_split(self, kind: str, label: str, plan) -> None:
        """A row with ``plan``'s host / UVA experts a split layer (each distinct pair) and its layers with a host."""
        self.emit(model=kind, plan=label, splits=sorted({(len(l.experts.cpu), len(l.experts.uva))
                                                         for l in plan.layers if l.experts is not None}),
                  host_layers=sum(1 for l in plan.layers if l.experts is not None and l.experts.cpu))

    # -- the runs ---------------------------------------------------------------------------------------
    def uniform(self, kind: str) -> None:
        model, config = self.build(kind)
        self.own_cpu(model, config, kind)
        spec = runtime.describe(model, name=kind)
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        budget = int(total * 0.45) if self.dry else BUDGETS[kind]
        experts_only = {"kinds": ["routed_experts"]}
        cases = [("decode32", (32, 1)), ("prefill", (1, self.prefill)), ("decode1", (1, 1))]
        plans = [("uva", self.plan(spec, budget, 32, backend="uva", **experts_only)),
                 ("hybrid", self.plan(spec, budget, 32, backends={"routed_experts": "cpu"}, **experts_only)),
                 ("auto prefill", self.plan(spec, budget, self.prefill)),
                 ("auto decode32", self.plan(spec, budget, 32))]
        only = {"auto prefill": cases[1:2], "auto decode32": cases[:1]}
        by_label = dict(plans)
        turns = [("uva", by_label["uva"], {}, None), ("hybrid", by_label["hybrid"], {}, None),
                 ("auto decode1", self.plan(spec, budget, 1), {}, None),
                 ("uva, expert_graphs off", by_label["uva"], {"expert_graphs": False}, None)]
        if self.calibrated is not None:  # auto's batch-1 plan as a user who calibrated gets it
            turns.insert(3, ("auto decode1, calibrated", self.plan(spec, budget, 1, self.calibrated), {}, None))
        self.in_turn(kind, model, config, turns, rounds=self.turn_rounds)
        for label, plan in [] if self.turns_only else plans:
            self.emit(model=kind, plan=label, notes=plan.summary.notes, backend=plan.summary.backend,
                      gpu_budget=budget)
            self.measure(kind, label, plan, model, config, only.get(label, cases))
        profile = self.hw
        for share in self.host_shares:  # other splits: the profile's host_link_share moves auto's host share
            self.hw = profile.model_copy(update={"host_link_share": share})
            try:
                label = f"auto decode32, host_link_share {share}"
                plan = self.plan(spec, budget, 32)
                self.emit_split(kind, label, plan)
                self.measure(kind, label, plan, model, config, cases[:1])
            finally:
                self.hw = profile
        for round_ in range(2 if self.own_host_figures else 0):  # auto planned with this run's host figures, twice
            self.measure(kind, "auto decode32, profile", dict(plans)["auto decode32"], model, config, cases[:1])
            self.hw = profile.model_copy(update=self.host_figures)
            try:
                label = "auto decode32, this run's host figures"
                plan = self.plan(spec, budget, 32)
                if round_ == 0:
                    self.emit_split(kind, label, plan)
                self.measure(kind, label, plan, model, config, cases[:1])
            finally:
                self.hw = profile
        if self.host_threads:  # the auto plan for decode 32 again, its host part on other thread counts
            plan = dict(plans)["auto decode32"]
            for threads in self.host_threads:
                self.measure(kind, f"auto decode32, host_threads {threads}", plan, model, config, cases[:1],
                             host_threads=threads)
        for round_ in range(2 if self.host_pages else 0):  # the same plans applied on 4 KiB or huge pages, twice
            for pages in self.host_pages:
                for label in ("uva", "auto decode32") if round_ == 0 else ("auto decode32",):
                    with setting(pinned, "HUGE_PAGES", pages == "huge"):
                        self.measure(kind, f"{label}, pages {pages}", dict(plans)[label], model, config, cases[:1])
        for round_ in range(2 if self.host_in_out else 0):  # the host's weights in either layout, twice
            for names in self.host_in_out:
                stored = frozenset(n for n in names.split(",") if n)
                with setting(expert_math, "HOST_IN_OUT", stored):
                    self.measure(kind, f"auto decode32, host stores [in, out]: {names or 'none'}",
                                 dict(plans)["auto decode32"], model, config, cases[:1])
        for round_ in range(2 if self.host_kernels else 0):  # the host's part through its kernel or torch.bmm, twice
            for kernel in self.host_kernels:
                with setting(host_matmul, "KERNEL", kernel == "on"), \
                        setting(host_matmul, "MAX_PASSES", math.inf if kernel == "on" else host_matmul.MAX_PASSES):
                    for label in ("hybrid", "auto decode32"):
                        self.measure(kind, f"{label}, host kernel {kernel}", dict(plans)[label], model, config,
                                     cases[:1])
        if self.levels_exactness:
            self.exact_levels(kind, dict(plans)["hybrid"], model, config)
        for round_ in range(2 if self.host_guards else 0):  # the host plans with the guard on and off, twice
            for guard in self.host_guards:  # and auto's with its host on fewer threads (a host slower than planned)
                runs = [(label, None) for label in ("hybrid", "auto decode32")]
                runs += [("auto decode32", threads) for threads in self.host_threads]
                for label, threads in runs:
                    name = f"{label}, guard {guard}" + (f", host_threads {threads}" if threads else "")
                    self.measure(kind, name, dict(plans)[label], model, config, cases[:1], host_threads=threads,
                                 host_levels=guard == "on")
        for interval in self.switch_intervals:  # the issuing thread and the host's thread share the GIL
            was = sys.getswitchinterval()
            sys.setswitchinterval(interval)
            try:
                self.measure(kind, f"auto decode32, switch interval {interval}", dict(plans)["auto decode32"], model,
                             config, cases[:1])
            finally:
                sys.setswitchinterval(was)
        del model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def skewed(self) -> None:
        kind = "qwen3_moe"
        model, config = self.build(kind)
        self.own_cpu(model, config, kind)
        spec = runtime.describe(model, name=kind)
        hot = bias_routers(model, config, self.ids((128, 1), config.vocab_size, seed=7), self)
        sample = self.ids((64, 1), config.vocab_size, seed=9)
        with record_routing(model) as recorder, torch.inference_mode():
            for seed in range(4):
                model(self.ids((64, 1), config.vocab_size, seed=10 + seed), use_cache=False)
            stats = recorder.stats(kind, f"bench_moe_hybrid: 4 decode steps of 64 tokens, routers biased to {hot}")
        path = self.folder / "routing-skewed.yaml"
        path.write_text(dump_model(stats))
        stats, sha = load_routing(path)
        self.emit(model=kind, histogram=histogram(stats), layers=len(stats.layers), file=str(path))
        expert_bytes = sum(t.nbytes for layer in spec.model.expanded() for t in layer.params
                           if param_kind(layer.name, t.name, t.kind) == "routed_experts")
        total = sum(layer.nbytes for layer in spec.model.expanded())
        budget = total - expert_bytes + expert_bytes // 4
        per_expert = {layer.name: sum(t.nbytes for t in layer.params if param_kind(layer.name, t.name, t.kind)
                                      == "routed_experts") // layer.moe.experts
                      for layer in spec.model.expanded() if layer.moe is not None}
        ref = RoutingRef(file=path.name, sha256=sha)
        experts_only = {"kinds": ["routed_experts"], "backend": "uva"}
        plans = [("uva", self.plan(spec, budget, 1, **experts_only), None),
                 ("hot", self.plan(spec, budget, 1, routing=stats, routing_ref=ref, **experts_only), stats.shares()),
                 ("hot+cpu", self.plan(spec, budget, 1, routing=stats, routing_ref=ref, kinds=["routed_experts"],
                                       backends={"routed_experts": "cpu"}), stats.shares())]
        turns = [("uva", plans[0][1], {}, None), ("hot", plans[1][1], {}, plans[1][2]),
                 ("uva, expert_graphs off", plans[0][1], {"expert_graphs": False}, None),
                 ("hot, expert_graphs off", plans[1][1], {"expert_graphs": False}, plans[1][2])]
        if self.turns_only:
            self.in_turn(f"{kind} skewed", model, config, turns, rounds=self.turn_rounds)
            plans = []
        else:
            self.resident(f"{kind} skewed", self.plan(spec, 2 * total, 1), model, config, (1, 1))
        for label, plan, measured in plans:
            self.emit(model=kind, plan=label, notes=plan.summary.notes, backend=plan.summary.backend,
                      gpu_budget=budget, routing=plan.summary.routing)
            self.measure(f"{kind} skewed", label, plan, model, config, [("decode1", (1, 1))], shares=measured,
                         graph=label != "hot+cpu", link=per_expert)
            if label == "hot":  # the eager step without the split layers' CUDA graphs (runtime/shape_graphs.py)
                self.measure(f"{kind} skewed", "hot, expert_graphs off", plan, model, config, [("decode1", (1, 1))],
                             shares=measured, link=per_expert, expert_graphs=False)
                self.in_turn(f"{kind} skewed", model, config, turns, rounds=self.turn_rounds)
        del sample, model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


@contextmanager
def setting(owner, name: str, value):
    """``owner.name`` set to ``value`` inside the block, put back after it (a runtime switch measured side by side)."""
    was = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, was)


def host_times(model, ids) -> dict:
    """The host's time per split layer in one forward (the cpu backend's host_rows, on whichever thread runs it)."""
    import runtime.cpu_experts as cpu_experts

    real, times = cpu_experts.host_rows, []

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            times.append((time.perf_counter() - t0) * 1e3)

    cpu_experts.host_rows = timed
    try:
        with torch.inference_mode():
            model(ids, use_cache=False)
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)
    finally:
        cpu_experts.host_rows = real
    return {"layers": len(times), "median": round(statistics.median(times), 3) if times else None,
            "total": round(sum(times), 3)}


def histogram(stats) -> dict:
    """Per layer, the share of the routed choices its most used 5, 10, 20 and 50% of experts received (mean over
    the layers), and the mean share of each decile of experts, most used first."""
    out: dict[str, object] = {}
    per_layer = [sorted((c / max(1, sum(layer.counts)) for c in layer.counts), reverse=True) for layer in stats.layers]
    for p in (5, 10, 20, 50):
        out[f"top {p}%"] = round(statistics.mean(sum(s[:max(1, len(s) * p // 100)]) for s in per_layer), 4)
    out["deciles"] = [round(statistics.mean(sum(s[len(s) * d // 10:len(s) * (d + 1) // 10]) for s in per_layer), 4)
                      for d in range(10)]
    return out


def bias_routers(model, config, ids, bench: Bench) -> dict:
    """Give every Qwen3-MoE router a bias of ``b`` on the logits of a fifth of its experts (chosen per layer), with
    ``b`` the value of a short search that gets those experts closest to 80% of the choices of ``ids`` (decode
    steps, as the routing is then recorded on): a ladder, then halving the bracket until within 2 points (the
    ladder alone chose 1.0 on the H200, 2026-12-02, and the recorded top fifth got 64.6%)."""
    routers = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
    g = torch.Generator().manual_seed(3)
    experts, hot_n = config.num_experts, max(1, int(config.num_experts * HOT_SHARE))
    masks = []
    for router in routers:
        mask = torch.zeros(experts, device=router.weight.device, dtype=torch.float32)
        mask[torch.randperm(experts, generator=g)[:hot_n].to(mask.device)] = 1.0
        masks.append(mask)
        router.forward = _biased(router, mask)
    def share_at(b: float) -> float:
        for router in routers:
            router.bias_value = b
        with record_routing(model) as recorder, torch.inference_mode():
            model(ids, use_cache=False)
            stats = recorder.stats("x")
        share = statistics.mean(sum(c for c, m in zip(layer.counts, mask.tolist()) if m) / max(1, sum(layer.counts))
                                for layer, mask in zip(stats.layers, masks))
        bench.emit(model="qwen3_moe skewed", bias=b, hot_share_of_choices=round(share, 4))
        return share

    # a ladder, then halving the bracket around the target (the share grows with the bias)
    tried = [(b, share_at(b)) for b in (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0)]
    below = max((t for t in tried if t[1] <= HOT_TARGET), key=lambda t: t[0], default=tried[0])
    above = min((t for t in tried if t[1] > HOT_TARGET), key=lambda t: t[0], default=None)
    for _ in range(BISECTIONS if above is not None else 0):
        if min(abs(below[1] - HOT_TARGET), abs(above[1] - HOT_TARGET)) <= HOT_TOLERANCE:
            break
        mid = (below[0] + above[0]) / 2
        found = (mid, share_at(mid))
        tried.append(found)
        below, above = (found, above) if found[1] <= HOT_TARGET else (below, found)
    best = min(tried, key=lambda t: abs(t[1] - HOT_TARGET))
    for router in routers:
        router.bias_value = best[0]
    return {"bias": best[0], "hot_experts": hot_n, "share": round(best[1], 4)}


def _biased(router, mask):
    """Qwen3-MoE's top-k router (softmax, top-k, renormalized) with ``router.bias_value * mask`` on its logits."""
    router.bias_value = 0.0

    def forward(hidden_states):
        hidden_states = hidden_states.reshape(-1, router.hidden_dim)
        logits = F.linear(hidden_states, router.weight) + (router.bias_value * mask).to(hidden_states.dtype)
        probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
        top, index = torch.topk(probs, router.top_k, dim=-1)
        if router.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top.to(logits.dtype), index

    return forward


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (the test suite runs this)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", choices=["qwen3_moe", "phimoe", "skewed"], action="append")
    ap.add_argument("--cases", choices=CASES, action="append", help="the workloads measured (default: all)")
    ap.add_argument("--profile", default="h200", help="the hardware profile plans are made and predicted with "
                    "(a bundled name or a file, as `planner plan --hardware`; default the bundled h200)")
    ap.add_argument("--calibrated", help="a profile `planner calibrate` wrote on this machine (run it just before): "
                    "every prediction is also made with it (``predicted_calibrated_ms``), the prediction a user "
                    "who calibrated gets; plans are still made with --profile")
    ap.add_argument("--join-waste", type=float, action="append", help="measure the host plans with the padded "
                    "pass's batches joined at each of these values of runtime.expert_math.JOIN_WASTE, side by side "
                    "(0: each run of touched experts apart; default the runtime's)")
    ap.add_argument("--host-share", type=float, action="append", help="also plan and measure auto at decode 32 with "
                    "the profile's host_link_share at each of these values (they move the host's share of a split "
                    "layer's experts): the measured step by split")
    ap.add_argument("--host-threads", type=int, action="append", help="also measure auto's decode-32 plan with the "
                    "host's part on this many threads (runtime.apply's host_threads; default: every CPU but one), "
                    "side by side: whether the issuing thread and the host's threads contend for cores")
    ap.add_argument("--host-pages", choices=["4k", "huge"], action="append", help="also measure the uva plan and "
                    "auto's decode-32 plan applied with their pinned arenas on 4 KiB pages or advised huge pages "
                    "(runtime.pinned.HUGE_PAGES), side by side (auto's twice)")
    ap.add_argument("--host-in-out", action="append", help="also measure auto's decode-32 plan with the host "
                    "storing these of its weights [E, in, out] (comma-separated names, '' for none: "
                    "runtime.expert_math.HOST_IN_OUT), side by side, twice; 'down_proj' is the host's layout before "
                    "2026-12-03")
    ap.add_argument("--host-kernel", choices=["on", "off"], action="append", help="also measure the hybrid plan and "
                    "auto's decode-32 plan with the host's part through runtime/host_matmul.py's kernel at any rows an "
                    "expert (on: runtime.host_matmul.MAX_PASSES lifted) or always torch.bmm (off: "
                    "runtime.host_matmul.KERNEL), side by side, twice; the plain rows take the runtime's rule")
    ap.add_argument("--host-kernel-defines", default="", help="build the host's kernel with these comma-separated "
                    "-D defines (runtime.host_matmul.DEFINES; bench/probe_host_kernel.py's best variant), for the "
                    "whole run")
    ap.add_argument("--switch-interval", type=float, action="append", help="also measure auto's decode-32 plan with "
                    "Python's GIL switch interval at these seconds (sys.setswitchinterval; default 0.005): the "
                    "issuing thread and the host's thread take turns at the GIL between torch calls")
    ap.add_argument("--host-guard", choices=["on", "off"], action="append", help="also measure the hybrid plan and "
                    "auto's decode-32 plan applied with host_levels on or off (each split layer moves its "
                    "split to the host's measured speed, either way: runtime/host_guard.py), side by side, twice; "
                    "with --host-threads, auto's plan also with its host on that many threads (a slower host)")
    ap.add_argument("--own-host-figures", action="store_true", help="also plan auto for decode 32 with the host's "
                    "figures measured at the start of this run in place of the profile's, and measure it beside "
                    "auto's plan from the profile, twice (their predictions with the figures each was planned with)")
    ap.add_argument("--exact-batches", type=int, help="decode-32 batches the logits are compared on (default "
                    f"{len(EXACT_SEEDS)}: {32 * len(EXACT_SEEDS)} positions)")
    ap.add_argument("--exact-levels", action="store_true", help="also compare the hybrid plan's logits with the "
                    "resident model's with every split layer held at one level (none of the "
                    "experts in host memory on the host, half the plan's, the plan's, every one)")
    ap.add_argument("--turn-rounds", type=int, help="rounds of the side-by-side eager turns at decode 1 (the skewed "
                    "part: all-UVA, hot, both without their layer graphs; each uniform model: all-UVA, hybrid, "
                    "auto's plan for decode at batch 1, all-UVA without its layer graphs; default 5)")
    ap.add_argument("--turns-only", action="store_true", help="measure only those turns (no other plan or case)")
    ap.add_argument("--host-load", type=int, default=0, help="run this many other processes for the whole run, each "
                    "summing a 1 GiB tensor on one thread over and over (another load on the machine: the host slower "
                    "than planned, as the levels of runtime/host_guard.py meet it)")
    args = ap.parse_args(argv)
    host_matmul.DEFINES = tuple(d for d in args.host_kernel_defines.split(",") if d)
    host_matmul.library.cache_clear()
    with host_load(args.host_load, 2**20 if args.dry_run else 2**28):
        return run(args)


LOAD = "import torch\ntorch.set_num_threads(1)\nx = torch.ones({numel})\nwhile True:\n    x.sum()\n"


@contextmanager
def host_load(processes: int, numel: int):
    """``processes`` other processes reading ``numel`` float32s of host memory on one core each while the block
    runs."""
    running = [subprocess.Popen([sys.executable, "-c", LOAD.format(numel=numel)]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in running:
            p.kill()
            p.wait()


def host_cpu() -> dict:
    """The host's CPU as Linux describes it: its model, the CPUs this process may run on, and the physical cores
    under them (two hyperthreads of one core share its AMX unit; machines of one kind have differed in their host's
    speed in a forward by 2x)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip()))
        except OSError:
            cores.add(("?", str(cpu)))
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None
    return {"model": model, "cpus": len(cpus), "cores": len(cores)}


def run(args) -> int:
    bench = Bench(args)
    only = set(args.only or ("qwen3_moe", "phimoe", "skewed"))
    t0 = time.perf_counter()
    bench.emit(torch=torch.__version__, device=torch.cuda.get_device_name(bench.device)
               if bench.device.type == "cuda" else "cpu", profile=bench.hw.name, dry_run=bench.dry,
               date=time.strftime("%Y-%m-%d"), host_load_processes=args.host_load, host_cpu=host_cpu())
    bench.calibrate_host()
    for kind in ("qwen3_moe", "phimoe"):
        if kind in only:
            bench.uniform(kind)
    if "skewed" in only:
        bench.skewed()
    bench.emit(total_s=round(time.perf_counter() - t0, 1))
    bench.out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
