"""What changed between two plans, decided here and worded in planner/review/diff_render.py.

In review order: how much moved (the churn), the model (name, spec hash, layers added, removed or
renamed, param shapes and dtypes), memory with the predicted step time per workload (compared only
when both plans were predicted alike), which params moved between ``GPU``, ``host (prefetch)`` and
``host (uva)``, the settings, the prefetch schedule, and the rest. Layers and params with the same
change are grouped (``model.layers.{2,4,6}: mlp.*``); groups are exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.plan import Plan
from schemas.plan_content import PlanLayer, PlanParam
from schemas.plan_memory import PARTS
from schemas.prediction import Predictions
from schemas.sizes import format_bytes

from planner.words.names import join_names

__all__ = ["BYTE_FIELDS", "GPU", "PREFETCH", "UVA", "PlanDiff", "diff_plans", "placements"]

BYTE_FIELDS = ("gpu_budget_bytes", "cpu_budget_bytes", "total_bytes", "resident_bytes", "offloaded_bytes",
               "buffer_bytes", "peak_gpu_bytes", "pinned_host_bytes")
SETTINGS = ("backend", "strategy", "prefetch_step")
MEMORY_FIELDS = tuple(name for name, _ in PARTS)  # of the plans' memory sections
MODEL_FIELDS = ("model", "spec_sha256", "layers", "rank", "world_size")  # summary fields that describe the model
PARAM_FIELDS = ("shape", "dtype", "stride", "buffer", "kind", "shard")  # compared per param (bytes follow from them)

GPU, PREFETCH, UVA = "GPU", "host (prefetch)", "host (uva)"
MOVE_ORDER = ((GPU, PREFETCH), (GPU, UVA), (PREFETCH, GPU), (UVA, GPU), (PREFETCH, UVA), (UVA, PREFETCH))


@dataclass(frozen=True)
class Change:
    field: str
    old: object
    new: object


@dataclass(frozen=True)
class MemoryDelta:
    field: str
    old: int | None
    new: int | None

    @property
    def delta(self) -> int:
        return (self.new or 0) - (self.old or 0)


@dataclass(frozen=True)
class TimeDelta:
    """The predicted step time of one workload in the old and the new plan."""

    workload: str
    tokens: int
    old_ms: float
    new_ms: float

    @property
    def ratio(self) -> float | None:
        return self.new_ms / self.old_ms if self.old_ms > 0 else None


@dataclass
class ParamGroup:
    """One change to the same params of several layers: a move (``what`` = ``placement``, old and new
    are placements) or a change to the params' description (``shape``, ``dtype``, ``stride``,
    ``buffer``, ``kind``, ``shard``, ``tied``, or ``param`` for one added or removed)."""

    what: str
    old: str
    new: str
    layers: list[str]
    params: list[str]  # relative to each layer
    layers_text: str  # model.layers.{2,4,6}
    params_text: str  # ``*`` every param of the layer, ``mlp.*`` every param under ``mlp.``
    bytes: int  # of the params in all the layers (the new size; the old one for a removed param)


@dataclass
class Churn:
    """Params that moved, by direction, with their bytes."""

    to_host: int = 0
    to_host_bytes: int = 0
    to_gpu: int = 0
    to_gpu_bytes: int = 0
    between_host: int = 0  # prefetch <-> UVA
    between_host_bytes: int = 0
    net_gpu_bytes: int = 0  # to_gpu_bytes - to_host_bytes

    @property
    def moved(self) -> bool:
        return bool(self.to_host or self.to_gpu or self.between_host)


@dataclass
class ModelDiff:
    changes: list[Change] = field(default_factory=list)  # model, spec_sha256, layer count
    layers_added: list[str] = field(default_factory=list)
    layers_removed: list[str] = field(default_factory=list)
    layers_renamed: list[tuple[str, str]] = field(default_factory=list)  # (old, new): same params
    layer_order_changed: bool = False
    params: list[ParamGroup] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes or self.layers_added or self.layers_removed or self.layers_renamed
                    or self.layer_order_changed or self.params)


@dataclass(frozen=True)
class PrefetchChange:
    layer: str
    old: dict | None  # {slot, span, copy_before, previous_forward} or None
    new: dict | None

    @property
    def kind(self) -> str:
        return "new" if self.old is None else ("dropped" if self.new is None else "changed")


@dataclass
class PlanDiff:
    churn: Churn = field(default_factory=Churn)
    model: ModelDiff = field(default_factory=ModelDiff)
    memory: list[MemoryDelta] = field(default_factory=list)  # every summary byte field (changed or not)
    time: list[TimeDelta] = field(default_factory=list)  # every workload (changed or not), when comparable
    hardware: str | None = None  # the profile both plans were predicted with
    time_note: str | None = None  # why the predicted times are not compared
    moves: list[ParamGroup] = field(default_factory=list)  # what = "placement"
    offloaded_layers: Change | None = None
    settings: list[Change] = field(default_factory=list)  # backend, strategy, prefetch_step
    schedule: list[PrefetchChange] = field(default_factory=list)  # slot / trigger changes, in layer order
    other: list[Change] = field(default_factory=list)  # buffer pool, predictions, or what else differs

    @property
    def changed(self) -> bool:
        return bool(self.churn.moved or self.model.changed or any(m.old != m.new for m in self.memory)
                    or any(t.old_ms != t.new_ms for t in self.time) or self.moves or self.offloaded_layers
                    or self.settings or self.schedule or self.other)

    def _moved(self, to_gpu: bool) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for g in self.moves:
            if (g.new == GPU) == to_gpu and GPU in (g.old, g.new):
                for layer in g.layers:
                    out.setdefault(layer, []).extend(g.params)
        return out

    @property
    def to_host(self) -> dict[str, list[str]]:
        """Layer -> params that moved from the GPU to host memory."""
        return self._moved(to_gpu=False)

    @property
    def to_gpu(self) -> dict[str, list[str]]:
        """Layer -> params that moved from host memory to the GPU."""
        return self._moved(to_gpu=True)


def placements(plan: Plan, layer: PlanLayer) -> dict[str, str]:
    """Where each param of ``layer`` lives: GPU, host (prefetch) or host (uva). A layer's ``uva`` list
    (when plans carry one) names the offloaded params read through UVA; without it the plan's backend
    says how all of them are read."""
    uva = set(getattr(layer, "uva", None) or [])
    offloaded = set(layer.offloaded)
    all_uva = plan.summary.backend == "uva"
    return {p: GPU if p not in offloaded else (UVA if all_uva or p in uva else PREFETCH) for p in layer.params}


# ---------------------------------------------------------------------------
# Grouping: one line for the same change in many layers.


@dataclass(frozen=True)
class _Item:
    layer: str
    param: str
    what: str
    old: str
    new: str
    bytes: int


def _compress_params(params: list[str], all_params: list[str]) -> str:
    """``*`` for all of a layer's params; ``mlp.*`` when every param under ``mlp.`` is listed."""
    if len(all_params) > 1 and set(params) == set(all_params):
        return "*"
    out, done = [], set()
    for p in params:
        if p in done:
            continue
        head = p.split(".")[0]
        under = [q for q in all_params if q.startswith(head + ".")]
        if len(under) > 1 and set(under) <= set(params):
            out.append(f"{head}.*")
            done.update(under)
        else:
            out.append(p)
            done.add(p)
    return ", ".join(out)


def _group(items: list[_Item], layer_params: dict[str, list[str]], order: list[tuple]) -> list[ParamGroup]:
    """Items of one change in one layer become one entry; layers with the same entry are merged.
    Groups are sorted by ``order`` (positions of (old, new); others last), then by first layer."""
    per_layer: dict[tuple, list[_Item]] = {}
    for it in items:
        per_layer.setdefault((it.layer, it.what, it.old, it.new), []).append(it)
    merged: dict[tuple, list[tuple[str, int]]] = {}
    position = {name: i for i, name in enumerate(layer_params)}
    for (layer, what, old, new), its in per_layer.items():
        params = [it.param for it in its]
        text = _compress_params(params, layer_params.get(layer, params))
        merged.setdefault((what, old, new, tuple(params), text), []).append((layer, sum(it.bytes for it in its)))
    groups = [ParamGroup(what, old, new, [name for name, _ in rows], list(params), join_names(name for name, _ in rows),
                         text, sum(b for _, b in rows))
              for (what, old, new, params, text), rows in merged.items()]
    rank = {pair: i for i, pair in enumerate(order)}
    groups.sort(key=lambda g: (rank.get((g.old, g.new), len(rank)), position.get(g.layers[0], len(position))))
    return groups


# ---------------------------------------------------------------------------
# The model.


def _describe(p: PlanParam) -> str:
    return f"{p.dtype}[{', '.join(map(str, p.shape))}]"


def _field_text(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(getattr(value, "value", value))


def _signature(layer: PlanLayer) -> tuple:
    return tuple((name, tuple(p.shape), p.dtype) for name, p in layer.params.items())


def _renames(removed: list[PlanLayer], added: list[PlanLayer]) -> list[tuple[str, str]]:
    """Removed and added layers with the same params (names, shapes, dtypes), paired in order."""
    pairs, free = [], list(added)
    for lo in removed:
        match = next((ln for ln in free if _signature(ln) == _signature(lo)), None)
        if match is not None:
            free.remove(match)
            pairs.append((lo.name, match.name))
    return pairs


def _param_items(lo: PlanLayer, ln: PlanLayer) -> list[_Item]:
    """How the params of one layer (in both plans) changed."""
    items = []
    for name in [*lo.params, *(p for p in ln.params if p not in lo.params)]:
        po, pn = lo.params.get(name), ln.params.get(name)
        if po is None or pn is None:
            items.append(_Item(ln.name, name, "param", "none" if po is None else _describe(po),
                               "none" if pn is None else _describe(pn), (pn or po).bytes))
            continue
        for f in PARAM_FIELDS:
            a, b = getattr(po, f), getattr(pn, f)
            if a != b:
                items.append(_Item(ln.name, name, f, _field_text(a), _field_text(b), pn.bytes))
        if lo.tied.get(name) != ln.tied.get(name):
            items.append(_Item(ln.name, name, "tied", _field_text(lo.tied.get(name)),
                               _field_text(ln.tied.get(name)), pn.bytes))
    return items


# ---------------------------------------------------------------------------
# The diff.


def _time(d: PlanDiff, old: Predictions | None, new: Predictions | None) -> None:
    """Predicted step times side by side, or a note saying why they cannot be compared."""
    if old is None or new is None:
        which = "either plan" if old is None and new is None else ("the old plan" if old is None else "the new plan")
        if old is not new:
            d.time_note = f"predicted step times not compared: {which} has no predictions (re-plan it)"
        return
    if old.hardware != new.hardware:
        d.time_note = (f"predicted step times not compared: the old plan was predicted on '{old.hardware}', "
                       f"the new one on '{new.hardware}' (re-plan both with the same --hardware)")
        d.other.append(Change("predictions.hardware", old.hardware, new.hardware))
        return
    if old.profile is not None and new.profile is not None and old.profile != new.profile:
        d.time_note = (f"predicted step times not compared: the plans were predicted with two profiles named "
                       f"'{old.hardware}' whose figures differ (re-plan both with the same --hardware)")
        return
    if _workloads(old) != _workloads(new):
        def show(p: Predictions) -> str:
            return ", ".join(f"{w}={t}" + (f":{x:g}" if x != 1 else "") for w, t, x in _workloads(p))
        d.time_note = (f"predicted step times not compared: the plans were predicted for different workloads "
                       f"(old: {show(old)}; new: {show(new)})")
        d.other.append(Change("predictions.workloads", show(old), show(new)))
        return
    d.hardware = old.hardware
    d.time = [TimeDelta(o.workload, o.tokens, o.step_ms, n.step_ms) for o, n in zip(old.workloads, new.workloads)]


def _workloads(preds: Predictions) -> list[tuple[str, int, float]]:
    return [(p.workload, p.tokens, p.weight) for p in preds.workloads]


def _prefetch(layer: PlanLayer, renamed: dict[str, str] | None = None) -> dict | None:
    if layer.prefetch is None:
        return None
    data = layer.prefetch.model_dump()
    if renamed:
        data["copy_before"] = renamed.get(data["copy_before"], data["copy_before"])
    return data


def _churn(moves: list[ParamGroup]) -> Churn:
    c = Churn()
    for g in moves:
        n = len(g.params) * len(g.layers)
        if g.new == GPU:
            c.to_gpu, c.to_gpu_bytes = c.to_gpu + n, c.to_gpu_bytes + g.bytes
        elif g.old == GPU:
            c.to_host, c.to_host_bytes = c.to_host + n, c.to_host_bytes + g.bytes
        else:
            c.between_host, c.between_host_bytes = c.between_host + n, c.between_host_bytes + g.bytes
    c.net_gpu_bytes = c.to_gpu_bytes - c.to_host_bytes
    return c


def _pool_text(plan: Plan) -> str:
    pool = plan.buffer_pool
    if pool is None:
        return "none"
    return f"{pool.slots} slots, {len(pool.keys)} keys, {format_bytes(pool.bytes)}"


def _pool_keys(plan: Plan) -> dict[str, str]:
    """Each kind of buffer in words (param, dtype, shape, stride) -> its slot ids."""
    keys = plan.buffer_pool.keys if plan.buffer_pool else []
    return {f"{k.param} {k.dtype}[{', '.join(map(str, k.shape))}]" + (
        "" if k.stride is None else f" stride [{', '.join(map(str, k.stride))}]"): _field_text(k.slots) + (
        " + span" if k.span else "") for k in keys}


def _pool_changes(old: Plan, new: Plan) -> list[Change]:
    """The pool's size and the kinds of buffer it holds; else which slots each kind has."""
    out = []
    if _pool_text(old) != _pool_text(new):
        out.append(Change("buffer_pool", _pool_text(old), _pool_text(new)))
    a, b = _pool_keys(old), _pool_keys(new)
    gone, came = [k for k in a if k not in b], [k for k in b if k not in a]
    if gone or came:
        out.append(Change("buffer_pool keys", ", ".join(gone) or "none", ", ".join(came) or "none"))
    if not out:  # the same size and kinds: say which kinds changed slots
        out += [Change(f"buffer_pool slots of {k}", a[k], b[k]) for k in a if k in b and a[k] != b[k]]
    return out


def _flat(value: object, path: str, out: dict[str, object]) -> dict[str, object]:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flat(v, f"{path}.{v.get('name', v.get('workload', i))}", out)
    else:
        out[path] = value
    return out


def _dumped(plan: Plan, other: Plan) -> dict:
    """``plan`` as data; the profile its predictions carry as its name alone when ``other`` carries none
    (a plan written before plans carried their profile): one line, not every figure."""
    data = plan.model_dump()
    mine, theirs = plan.predictions, other.predictions
    if mine is not None and mine.profile is not None and (theirs is None or theirs.profile is None):
        data["predictions"]["profile"] = mine.profile.name
    return data


def _leftovers(old: Plan, new: Plan) -> list[Change]:
    """What differs when nothing compared above did (the summary's explanations, details of the
    predictions, ...): each differing field by its path."""
    a, b = _flat(_dumped(old, new), "", {}), _flat(_dumped(new, old), "", {})
    return [Change(k, a.get(k), b.get(k)) for k in [*a, *(k for k in b if k not in a)] if a.get(k) != b.get(k)]


def diff_plans(old: Plan, new: Plan) -> PlanDiff:
    d = PlanDiff()
    so, sn = old.summary, new.summary
    old_layers = {layer.name: layer for layer in old.layers}
    new_layers = {layer.name: layer for layer in new.layers}

    m = d.model
    m.changes = [Change(f, getattr(so, f), getattr(sn, f)) for f in MODEL_FIELDS if getattr(so, f) != getattr(sn, f)]
    removed = [layer for layer in old.layers if layer.name not in new_layers]
    added = [layer for layer in new.layers if layer.name not in old_layers]
    m.layers_renamed = _renames(removed, added)
    old_name = {n: o for o, n in m.layers_renamed}
    new_name = {o: n for o, n in m.layers_renamed}
    m.layers_removed = [layer.name for layer in removed if layer.name not in new_name]
    m.layers_added = [layer.name for layer in added if layer.name not in old_name]
    matched = [(old_layers[old_name.get(ln.name, ln.name)], ln) for ln in new.layers
               if old_name.get(ln.name, ln.name) in old_layers]
    kept = {lo.name for lo, _ in matched}
    m.layer_order_changed = [lo.name for lo, _ in matched] != [layer.name for layer in old.layers if layer.name in kept]

    layer_params = {ln.name: list(ln.params) for ln in new.layers}
    param_items: list[_Item] = []
    move_items: list[_Item] = []
    for lo, ln in matched:
        param_items += _param_items(lo, ln)
        before, after = placements(old, lo), placements(new, ln)
        for p, where in after.items():
            if p in before and before[p] != where:
                move_items.append(_Item(ln.name, p, "placement", before[p], where, ln.params[p].bytes))
        if _prefetch(lo, new_name) != _prefetch(ln):
            d.schedule.append(PrefetchChange(ln.name, _prefetch(lo, new_name), _prefetch(ln)))
    m.params = _group(param_items, layer_params, order=[])
    d.moves = _group(move_items, layer_params, order=list(MOVE_ORDER))
    d.churn = _churn(d.moves)

    d.memory = [MemoryDelta(f, getattr(so, f), getattr(sn, f)) for f in BYTE_FIELDS]
    if old.memory is not None or new.memory is not None:
        d.memory += [MemoryDelta(f, _part(old, f), _part(new, f)) for f in MEMORY_FIELDS]
    _time(d, old.predictions, new.predictions)
    if so.offloaded_layers != sn.offloaded_layers:
        d.offloaded_layers = Change("offloaded_layers", so.offloaded_layers, sn.offloaded_layers)
    d.settings = [Change(f, getattr(so, f), getattr(sn, f)) for f in SETTINGS if getattr(so, f) != getattr(sn, f)]
    d.settings += _forward_changes(old, new)
    if old.buffer_pool != new.buffer_pool:
        d.other += _pool_changes(old, new)
    if not d.changed and old != new:
        d.other += _leftovers(old, new)
    return d


def _part(plan: Plan, field: str) -> int | None:
    """A part of the plan's memory section (None for a plan without one)."""
    return None if plan.memory is None else getattr(plan.memory, field)


def _forward_text(plan: Plan, name: str) -> str | None:
    """What the plan assumed forward ``name`` holds: ``32 x 4,096 tokens, logits last``."""
    f = plan.memory.forward(name) if plan.memory is not None else None
    if f is None:
        return None
    cache = f"{f.batch} x {f.context} tokens of KV cache" if f.context else f"{f.batch} sequences, no KV cache"
    return f"{f.tokens} tokens, {cache}" + (", logits of the last token" if f.logits == "last" else "")


def _forward_changes(old: Plan, new: Plan) -> list[Change]:
    """The forwards whose sequences, context or logits the two plans assume differently, and the batch chosen."""
    names = [f.workload for f in (new.memory.forwards if new.memory else [])]
    names += [f.workload for f in (old.memory.forwards if old.memory else []) if f.workload not in names]
    out = [Change(f"workload {name}", a, b) for name in names
           if (a := _forward_text(old, name)) != (b := _forward_text(new, name)) and a is not None and b is not None]
    batch_old = old.throughput.batch if old.throughput else None
    batch_new = new.throughput.batch if new.throughput else None
    if batch_old != batch_new:
        out.append(Change("batch chosen for tokens/s", batch_old, batch_new))
    return out
