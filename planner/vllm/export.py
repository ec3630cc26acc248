"""`planner export PLAN --to vllm`: the vLLM flags that make this plan, or why none do and what comes closest.

Decided here, worded in planner/vllm/export_render.py. A plan is expressible when vLLM's own
selection (planner/vllm/select.py) for some flags offloads exactly its params with its backend and
slots, so that ``plan --from-vllm`` of the flags gives the same placement. Not expressible:

- params offloaded outside the decoder layers (an embedding, the LM head): vLLM offloads only the
  layers make_layers builds;
- a mixed backend (UVA and prefetch in one plan): vLLM runs one offloader;
- experts split by expert (the cpu backend, hot experts on the GPU): vLLM moves whole params;
- a layer spanning the slots (schemas/schedule.py): vLLM gives every prefetched layer a slot of its own;
- an offloaded buffer (vLLM offloads parameters only), or part of a param vLLM fuses (``q_proj``
  without ``k_proj``: vLLM moves ``qkv_proj`` whole);
- prefetch: offloaded layers that are not the last K of every G for any G, K, or params no set of
  ``--offload-params`` segments selects exactly;
- UVA: params that are not the first ones in layer order (of those matching some
  ``--cpu-offload-params``): a budget spread.

The closest expressible plan is the one of a small family of flags (group sizes up to 8, the plan's
slots; ``--cpu-offload-gb`` for the bytes the budget needs) whose peak fits the plan's gpu_budget
(else its peak) with the lowest predicted step time on the plan's own hardware and workloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from schemas.plan import Plan
from schemas.spec_layers import Layer, Tensor

from planner.layers import build_graph, find_block_stack
from schemas.kinds import param_kind
from planner.words.names import join_names
from planner.vllm.flags import VllmFlags, gib_text
from planner.vllm.select import StackLayer, select

_CLOSEST_GROUPS = 8  # the closest plan tries group sizes 1..8


@dataclass(frozen=True)
class Problem:
    part: str  # what is not expressible, in a few words (a budget spread, a mixed backend, ...)
    detail: str


@dataclass(frozen=True)
class Closest:
    flags: VllmFlags
    peak_gpu_bytes: int
    weighted_step_ms: float
    target_bytes: int  # the plan's gpu_budget, else its peak

    @property
    def fits(self) -> bool:
        return self.peak_gpu_bytes <= self.target_bytes


@dataclass(frozen=True)
class Export:
    plan: Plan
    flags: VllmFlags | None  # None: not expressible
    problems: tuple[Problem, ...] = ()
    closest: Closest | None = None


def spec_layers(plan: Plan) -> list[Layer]:
    """The spec's layers as the plan records them (every param, ties, MoE facts). Layers with equal params
    share one tuple of them, as a loaded spec's do (what is worked out per layer is then worked out once)."""
    out = []
    interned: dict[tuple[Tensor, ...], tuple[Tensor, ...]] = {}
    for i, layer in enumerate(plan.layers):
        params = tuple(Tensor(rel, tuple(p.shape), p.dtype, None if p.stride is None else tuple(p.stride), p.buffer,
                              p.bytes, p.kind) for rel, p in layer.params.items() if rel not in layer.tied)
        out.append(Layer(layer.name, i, interned.setdefault(params, params), dict(layer.tied), moe=layer.moe))
    return out


def export(plan: Plan) -> Export:
    from planner.vllm.plan import stack_view

    layers = spec_layers(plan)
    stack = find_block_stack(build_graph(layers))
    view = stack_view(layers, stack)
    offloaded = _offloaded(plan)
    problems = _structural(plan, set(stack), view, offloaded)
    if plan.summary.backend == "none":
        return Export(plan, VllmFlags())
    if not problems:
        off = {layer.name: {p.name for p in layer.params if all(m in offloaded[layer.name] for m in p.members)}
               for layer in view}
        found = _find_uva(view, off) if plan.summary.backend == "uva" else \
            _find_group(view, off, plan.summary.prefetch_step or 1)
        if isinstance(found, VllmFlags):
            chosen = select(view, found).chosen
            assert {k: {p.name for p in v} for k, v in chosen.items()} == {k: v for k, v in off.items() if v}, found
            return Export(plan, found)
        problems = [found]
    return Export(plan, None, tuple(problems), _closest(plan, layers, stack, view, offloaded))


def _offloaded(plan: Plan) -> dict[str, set[str]]:
    """Each layer's offloaded params, by layer name."""
    return {layer.name: set(layer.offloaded) for layer in plan.layers}


def _structural(plan: Plan, stack: set[str], view: Sequence[StackLayer],
                offloaded: dict[str, set[str]]) -> list[Problem]:
    problems = []
    outside = [layer for layer in plan.layers if layer.offloaded and layer.name not in stack]
    if outside:
        kinds = {param_kind(layer.name, rel, layer.params[rel].kind) for layer in outside for rel in layer.offloaded}
        part = "an offloaded embedding" if "embedding" in kinds else "params offloaded outside the decoder layers"
        problems.append(Problem(part, f"{join_names(layer.name for layer in outside)} "
                                      f"{'is' if len(outside) == 1 else 'are'} offloaded; vLLM offloads only the "
                                      "decoder layers that make_layers builds"))
    uva = [f"{layer.name}.{p}" for layer in plan.layers for p in layer.uva]
    prefetched = [f"{layer.name}.{p}" for layer in plan.layers for p in layer.prefetched]
    if uva and prefetched:
        problems.append(Problem("a mixed backend", f"{len(uva)} param{'s' * (len(uva) != 1)} on UVA (e.g. {uva[0]}) "
                                                   f"and {len(prefetched)} prefetched (e.g. {prefetched[0]}); vLLM runs one offload backend"))
    split = [layer.name for layer in plan.layers if layer.experts is not None]
    if split:
        problems.append(Problem("experts split by expert", f"{join_names(split)} place their routed experts one by "
                                "one (the host CPU or GPU memory for some); vLLM's offloaders move whole params"))
    spanning = [layer.name for layer in plan.layers if layer.prefetch is not None and layer.prefetch.span]
    if spanning:
        problems.append(Problem("a layer spanning the slots", f"{join_names(spanning)}'s buffers lie over the slots' "
                                                             "bytes; vLLM gives every prefetched layer a slot"))
    buffers = [f"{layer.name}.{p}" for layer in plan.layers for p in layer.offloaded if layer.params[p].buffer]
    if buffers:
        problems.append(Problem("an offloaded buffer", f"{buffers[0]}{' and more' if len(buffers) > 1 else ''} "
                                                       "is a buffer; vLLM offloads parameters only"))
    for layer in view:
        off = offloaded[layer.name]
        for p in layer.params:
            moved = [m for m in p.members if m in off]
            if moved and len(moved) < len(p.members):
                kept = [m for m in p.members if m not in off]
                problems.append(Problem("a split fused param", f"{layer.name} offloads {', '.join(moved)} but not "
                                        f"{', '.join(kept[:3])}{' ...' if len(kept) > 3 else ''}; vLLM holds them as "
                                        f"one param, {p.name}, and moves it whole"))
                return problems
    return problems


# ---------------------------------------------------------------------------
# flags for an expressible plan


def segments_for(required: Iterable[str], forbidden: Iterable[str]) -> tuple[str, ...] | None:
    """Segments (vLLM's --offload-params) that match every ``required`` name and no ``forbidden`` one:
    () when nothing is forbidden (no filter), None when no set of segments can."""
    from planner.vllm.layout import matches

    need, bad = set(required), set(forbidden)
    if not bad:
        return ()
    runs = {".".join(parts[i:j]) for name in need for parts in [name.split(".")]
            for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)}
    safe = [r for r in runs if not any(matches(b, [r]) for b in bad)]
    out: list[str] = []
    left = set(need)
    while left:
        best = max(safe, key=lambda r: (sum(matches(n, [r]) for n in left), -r.count("."), -len(r), r), default=None)
        if best is None or not any(matches(n, [best]) for n in left):
            return None
        out.append(best)
        left = {n for n in left if not matches(n, [best])}
    return tuple(sorted(out))


def _find_group(view: Sequence[StackLayer], off: dict[str, set[str]], step: int) -> VllmFlags | Problem:
    """The first group rule (G ascending, then K) that picks every offloaded layer and whose picked layers'
    params some --offload-params segments split exactly as the plan does.

    O(n log n) in the stack depth, not cubic: for one G only the smallest K whose picks cover the offloaded
    layers can succeed (a larger K picks more layers, so more params are forbidden, and segments_for finds
    segments only while every required name has a run no forbidden name holds); the required params are the
    offloaded ones whatever the rule; the forbidden ones are the offloaded layers' kept params plus the
    names of the extra layers the rule picks, which depend only on which distinct name sets those layers
    have. Each G is read group by group (n / G steps) and ``segments_for`` runs once per distinct forbidden set."""
    n = len(view)
    used = [i for i, layer in enumerate(view) if off[layer.name]]
    required = frozenset(p for i in used for p in off[view[i].name])
    kept = frozenset(p.name for i in used for p in view[i].params if p.name not in off[view[i].name])
    classes: dict[frozenset[str], list[int]] = {}  # a layer's param names -> its positions
    for i, layer in enumerate(view):
        classes.setdefault(frozenset(p.name for p in layer.params), []).append(i)
    counts = {names: (_prefix(positions, n), sum(1 for i in positions if off[view[i].name]))
              for names, positions in classes.items()}
    after = _next_at_or_after(used, n)
    tried: dict[frozenset[str], tuple[str, ...] | None] = {}
    any_rule = False
    for g in range(1, n + 1):
        k = _smallest_k(after, n, g) if used else 1
        extra = _picked(n, g, k) - len(used)
        any_rule = any_rule or extra == 0
        forbidden = kept
        if extra:
            forbidden = forbidden.union(*(names for names, (prefix, mine) in counts.items()
                                          if _picked_in(prefix, n, g, k) > mine))
        if forbidden not in tried:
            tried[forbidden] = segments_for(required, forbidden)
        if tried[forbidden] is not None:
            return VllmFlags(group_size=g, num_in_group=k, prefetch_step=step, offload_params=tried[forbidden])
    names = join_names(view[i].name for i in used)
    if not any_rule:
        return Problem("a budget spread", f"the prefetched layers ({names}) are not the last K of every G decoder "
                                          "layers for any G and K (vLLM's group rule)")
    return Problem("a param selection", f"in every group rule that covers the prefetched layers ({names}), no "
                                        "--offload-params segments select exactly the offloaded params of each "
                                        "layer it picks")


def _prefix(positions: Sequence[int], n: int) -> list[int]:
    """``out[x]``: how many of ``positions`` are below x (x in 0..n)."""
    out = [0] * (n + 1)
    for i in positions:
        out[i + 1] += 1
    for x in range(n):
        out[x + 1] += out[x]
    return out


def _next_at_or_after(used: Sequence[int], n: int) -> list[int]:
    """``out[x]``: the first index of ``used`` at or after x (n when none), x in 0..n."""
    out = [n] * (n + 1)
    mark = set(used)
    for x in range(n - 1, -1, -1):
        out[x] = x if x in mark else out[x + 1]
    return out


def _smallest_k(after: list[int], n: int, g: int) -> int:
    """The smallest K with every used index among the last K of its group of G: G minus the smallest
    offset of a used index inside its group, found at each group's first used index."""
    low = g
    for start in range(0, n, g):
        first = after[start]
        if first < min(start + g, n):
            low = min(low, first - start)
            if low == 0:
                break
    return g - low


def _picked(n: int, g: int, k: int) -> int:
    """How many of ``n`` stack indices the group rule (G, K) picks."""
    return (n // g) * k + max(0, n % g - (g - k))


def _picked_in(prefix: list[int], n: int, g: int, k: int) -> int:
    """How many of the positions counted by ``prefix`` the group rule (G, K) picks."""
    return sum(prefix[min(n, start + g)] - prefix[min(n, start + g - k)] for start in range(0, n, g))


def _find_uva(view: Sequence[StackLayer], off: dict[str, set[str]]) -> VllmFlags | Problem:
    seq = [(layer.name, p) for layer in view for p in layer.params]
    last = max(i for i, (name, p) in enumerate(seq) if p.name in off[name])
    required = [p.name for name, p in seq if p.name in off[name]]
    forbidden = [p.name for name, p in seq[:last] if p.name not in off[name]]
    segs = segments_for(required, forbidden)
    if segs is None:
        kept = next(f"{name}.{p.name}" for name, p in seq[:last] if p.name not in off[name])
        return Problem("a budget spread", f"vLLM's --cpu-offload-gb offloads params in layer order from the first "
                                          f"decoder layer, and this plan keeps {kept} on the GPU while it offloads "
                                          f"{seq[last][0]}.{seq[last][1].name}")
    from planner.vllm.layout import matches

    eligible = [p.nbytes for _, p in seq if not segs or matches(p.name, segs)]
    count = len(required)
    before = sum(eligible[:count - 1])
    upto = sum(eligible[:count]) if count < len(eligible) else max(sum(eligible), 1)
    return VllmFlags(cpu_offload_gb=float(gib_text(before, upto)), cpu_offload_params=segs)


# ---------------------------------------------------------------------------
# the closest expressible plan


def _closest(plan: Plan, layers: list[Layer], stack: list[str], view: Sequence[StackLayer],
             offloaded: dict[str, set[str]]) -> Closest | None:
    from planner.cost.predict import predict
    from planner.cost.predicted import chosen_profile, plan_workload
    from planner.vllm.plan import build

    if not stack:
        return None
    s = plan.summary
    target = s.gpu_budget_bytes if s.gpu_budget_bytes is not None else s.peak_gpu_bytes
    step = s.prefetch_step or 2
    offloaded_names = {p.name for layer in view for p in layer.params
                       if any(m in offloaded[layer.name] for m in p.members)}
    never = {p.name for layer in view for p in layer.params} - offloaded_names
    narrowed = segments_for(offloaded_names, never) if offloaded_names else None
    choices: list[VllmFlags] = []
    for segs in {(), narrowed} - {None}:
        for g in range(1, min(_CLOSEST_GROUPS, len(stack)) + 1):
            choices += [VllmFlags(group_size=g, num_in_group=k, prefetch_step=step, offload_params=segs)  # type: ignore[arg-type]
                        for k in range(1, g + 1)]
    need = s.total_bytes - (target - (plan.memory.non_weight_bytes if plan.memory is not None else 0))
    if need > 0:
        choices.append(VllmFlags(cpu_offload_gb=float(gib_text(need - 1, 2**62))))
    profile, workload = chosen_profile(plan, None), plan_workload(plan)
    built = [(f, build(layers, stack, f, model_name=s.model, spec_sha256=s.spec_sha256, gpu_budget=None,
                       cpu_budget=None, view=view, checked=False, memory=plan.memory)) for f in choices]
    fitting = [(f, p) for f, p in built if p.summary.peak_gpu_bytes <= target]
    pool = fitting or [min(built, key=lambda fp: fp[1].summary.peak_gpu_bytes)]
    scored = [(predict(p, profile, workload).weighted_step_ms, p.summary.peak_gpu_bytes, i, f)
              for i, (f, p) in enumerate(pool)]
    ms, peak, _, flags = min(scored)
    return Closest(flags, peak, ms, target)
