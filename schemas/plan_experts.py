"""Per-expert placement of an MoE layer's routed experts (a plan layer's ``experts``), and its check.

Transformers' MoE models hold a layer's routed experts as a few params whose first dimension is the
expert (``mlp.experts.gate_up_proj [E, 2I, H]``, ``mlp.experts.down_proj [E, H, I]``). An ``ExpertSplit``
cuts those params along that dimension and says, per expert, where its slice lives and who computes it:

- ``gpu``: held in GPU memory (hot experts), computed by GPU kernels;
- ``uva``: in pinned host memory, read in place by GPU kernels through UVA;
- ``cpu``: in host memory, computed by the host CPU while the GPU runs the rest of the layer (the ``cpu``
  backend); only the routed tokens' hidden states and the experts' outputs cross the link. Above
  ``cpu_max_tokens`` tokens in one call (a prefill) the GPU reads these experts through UVA instead.

Every expert is in exactly one list. The split params are listed in the layer's ``offloaded`` (their host
slices are pinned host bytes) and never in ``uva`` (the split says per expert); a split param's offloaded
bytes are its host experts' slices: ``bytes / E`` per expert. Prefetching single experts is not offered:
a copy moves every expert the layer has, which is what the whole-param prefetch backend already does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema

from schemas.fields import Count, PositiveCount
from schemas.numbered import runs
from schemas.fields import StrictModel

# a schemas.plan_content.PlanLayer: that module holds ExpertSplit in its layers, so it is not imported here
PlanLayer = Any

EXPERT_PLACES = ("gpu", "uva", "cpu")
_RUN = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def parse_ids(value: Any) -> Any:
    """Expert ids as a plan writes them, ``"0-5,7,9-127"`` (runs inclusive), or a list of ids; sorted."""
    if isinstance(value, str):
        ids: list[int] = []
        for part in value.split(",") if value.strip() else []:
            m = _RUN.fullmatch(part)
            if m is None:
                raise ValueError(f"'{part.strip()}' is not an expert id or a run of them (e.g. '0-5,7,9-127')")
            lo, hi = int(m[1]), int(m[2] or m[1])
            if hi < lo:
                raise ValueError(f"'{part.strip()}': a run goes up ({hi} < {lo})")
            if hi - lo > 1 << 24:
                raise ValueError(f"'{part.strip()}': a run of more than {1 << 24} experts")
            ids += range(lo, hi + 1)
        return sorted(ids)
    if type(value) is int:  # one id, as YAML reads ``cpu: 5``
        return [value]
    if isinstance(value, list) and all(type(v) is int for v in value):
        return sorted(value)
    return value


def format_ids(ids: list[int]) -> str:
    """``parse_ids``'s text: sorted ids as runs (a repeated id stays repeated)."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs(ids))


ExpertIds = Annotated[list[Count], BeforeValidator(parse_ids), PlainSerializer(format_ids, return_type=str),
                      WithJsonSchema({"type": "string", "pattern": r"^(\d+(-\d+)?(,\d+(-\d+)?)*)?$",
                                      "description": "expert ids, runs inclusive: 0-5,7,9-127"})]


class ExpertSplit(StrictModel):
    """Where each routed expert of the layer lives and runs; every other param of the layer as usual."""

    params: list[str] = Field(min_length=1, description="the layer's routed-expert params, cut along their first "
                              "dimension (one slice per expert)")
    gpu: ExpertIds = Field(default_factory=list, description="experts held in GPU memory (hot experts)")
    uva: ExpertIds = Field(default_factory=list, description="experts GPU kernels read in place through UVA")
    cpu: ExpertIds = Field(default_factory=list, description="experts the host CPU computes from host memory")
    cpu_max_tokens: PositiveCount | None = Field(
        default=None, description="a call with more tokens than this reads the cpu experts through UVA on the GPU "
        "instead (a prefill, where the GPU is faster); absent: the host computes them at any size")

    def place_of(self) -> dict[int, str]:
        """expert -> gpu | uva | cpu (the first list naming it)."""
        out: dict[int, str] = {}
        for place in EXPERT_PLACES:
            for e in getattr(self, place):
                out.setdefault(e, place)
        return out

    @property
    def host(self) -> int:
        """Experts whose slices live in host memory (uva and cpu)."""
        return len(self.uva) + len(self.cpu)


def host_bytes(param_bytes: int, experts: int, split: ExpertSplit) -> int:
    """Bytes of a split param that live in host memory: its host experts' slices."""
    return param_bytes // experts * split.host


def split_findings(layer: PlanLayer, backend: str, report: Callable[[tuple, str], None]) -> None:
    """Every way ``layer.experts`` contradicts the layer or the plan's backend; ``report(loc, text)``."""
    split = layer.experts
    if split is None:
        return
    loc: tuple[Any, ...] = ("experts",)
    if layer.moe is None:
        report(loc, "an expert split needs the layer's moe (experts and top_k)")
        return
    n = layer.moe.experts
    seen: dict[int, str] = {}
    for place in EXPERT_PLACES:
        for j, e in enumerate(getattr(split, place)):
            if e >= n:
                report(loc + (place, j), f"expert {e} does not exist: the layer has {n} experts (0..{n - 1})")
            elif e in seen:
                report(loc + (place, j), f"expert {e} is listed twice (also in {seen[e]})")
            else:
                seen[e] = place
    missing = [e for e in range(n) if e not in seen]
    if missing:
        report(loc, f"experts {_ids(missing)} are in none of gpu, uva and cpu: place each of the {n} experts once")
    if not split.host:
        report(loc, "every expert is on the GPU: nothing is split (drop experts and keep the params resident)")
    if split.cpu_max_tokens is not None and not split.cpu:
        report(loc + ("cpu_max_tokens",), "cpu_max_tokens without cpu experts")
    _param_findings(layer, split, n, loc, report)
    _backend_findings(split, backend, loc, report)


def _param_findings(layer: PlanLayer, split: ExpertSplit, n: int, loc: tuple, report) -> None:
    offloaded, on_uva = set(layer.offloaded), set(layer.uva)
    for j, rel in enumerate(split.params):
        where = loc + ("params", j)
        p = layer.params.get(rel)
        if p is None:
            report(where, f"'{rel}' is not a param of the layer")
        elif split.params.index(rel) != j:
            report(where, f"'{rel}' is listed twice")
        elif rel in layer.tied:
            report(where, f"'{rel}' is tied: a tied param is never split")
        elif not p.shape or p.shape[0] != n:
            report(where, f"'{rel}' has shape {p.shape}: a split param's first dimension is the expert ({n})")
        elif p.stride is not None:
            report(where, f"'{rel}' has a stride: only contiguous params are split by expert")
        elif rel not in offloaded:
            report(where, f"'{rel}' is split with experts in host memory but not listed in offloaded")
        elif rel in on_uva:
            report(where, f"'{rel}' is split by expert and also listed in uva (the split says which experts are on UVA)")


def _backend_findings(split: ExpertSplit, backend: str, loc: tuple, report) -> None:
    if split.cpu and backend not in ("cpu", "mixed"):
        report(loc + ("cpu",), f"cpu experts in a plan of backend {backend} (the host computes them: backend cpu, "
               "or mixed with other backends)")
    if split.uva and backend not in ("uva", "mixed"):
        report(loc + ("uva",), f"uva experts in a plan of backend {backend} (backend uva, or mixed with others)")


def backends_used(layers: Sequence[PlanLayer]) -> set[str]:
    """The param backends a plan's layers use: prefetch, uva, cpu."""
    used: set[str] = set()
    for layer in layers:
        split = layer.experts
        if layer.uva or (split is not None and split.uva):
            used.add("uva")
        if split is not None and split.cpu:
            used.add("cpu")
        if layer.prefetched:
            used.add("prefetch")
    return used


def split_params(layer: PlanLayer) -> Mapping[str, ExpertSplit]:
    """The layer's split params -> its split (empty without one)."""
    return {} if layer.experts is None else dict.fromkeys(layer.experts.params, layer.experts)


def experts_module(params: Sequence[str]) -> str:
    """The module holding a split's params, relative to its layer ('' when they are not under one module)."""
    parents = {rel.rpartition(".")[0] for rel in params}
    return parents.pop() if len(parents) == 1 else ""


def host_computes(split: ExpertSplit, tokens: float) -> bool:
    """Whether the host computes ``split``'s cpu experts at a call of ``tokens`` tokens: it has some and the call is
    no larger than ``cpu_max_tokens``; else GPU kernels read them through UVA."""
    return bool(split.cpu) and (split.cpu_max_tokens is None or tokens <= split.cpu_max_tokens)


def bypassed_host(host_ms: float, all_through_uva_ms: float) -> bool:
    """Whether a split layer's host part is skipped: it takes longer (``host_ms``) than GPU kernels reading every
    one of the layer's host-memory experts through UVA (``all_through_uva_ms``), which they then do (at a few rows a
    call the host's fixed costs, the hand-off among them, outweigh the experts it saves the link). One rule for the
    runtime's guard, on measured times (runtime/host_guard.py), and the cost model, on predicted ones
    (planner/cost/host_experts.py ``bypassed``)."""
    return host_ms > all_through_uva_ms


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(map(str, ids[:8])) + (f" … ({len(ids)} in all)" if len(ids) > 8 else "")
