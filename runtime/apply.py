"""``apply(plan, model)``: execute an offload plan on a real module; ``Handle.remove()`` undoes it."""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

import runtime.capture as capture
from runtime.check import UNPLANNED_CHOICES, Loose, Refs, Unplanned, check, meta_tensors
from runtime.cpu_experts import CpuOffloader, ExpertSplits, split_gpu_bytes
from runtime.routing import RoutingRecorder, experts_modules
from runtime.errors import ApplyError
from runtime.guard import (Guards, hold_hook_guards, install, refuse_if_applied, release_hook_guards,
                           reset_compiled_code)
from runtime.offloader import NoOffloader, Offloaded, Offloader
from runtime.placement import Placement
from runtime.prefetch import MixedOffloader, PrefetchOffloader
from runtime.progress import Progress
from runtime.shape_graphs import GraphPool, graphs_here
from runtime.this_rank import choose_plan, this_rank
from runtime.stats import PeakWatch, with_peaks
from runtime.teardown import RemoveError, Step, run_steps
from runtime.ties import extent, storage_key
from runtime.uva import UvaOffloader
from runtime.experts_forward import ExpertsForwards
from runtime.writes import WriteWatch, backend_of_each, report_writes
from schemas.expert_graphs import graphs_on
from schemas.plan import Plan
from schemas.sizes import format_bytes
from schemas.spec import SpecFile

log = logging.getLogger("runtime")

# every handle not yet removed (weak: a model keeps its own handle alive, see runtime/guard.py)
_ACTIVE: weakref.WeakValueDictionary[int, Handle] = weakref.WeakValueDictionary()


# what a Handle holds process-wide while its plan is applied (taken in Handle.__init__), and gives back
_RELEASE_HELD: list[Step] = [("compile guards", release_hook_guards), ("capture hook", capture.release)]


class Handle:
    """What ``apply`` returns: ``remove()`` (or leaving a ``with`` block) restores the model."""

    def __init__(self, plan: Plan, model: nn.Module, offloader: Offloader, placement: Placement,
                 watch: WriteWatch, splits: ExpertSplits | None = None, graphs: GraphPool | None = None) -> None:
        self.plan, self.model, self.offloader = plan, model, offloader
        self._placement = placement
        self._splits = splits
        self._routing: RoutingRecorder | None = None
        self._graphs = graphs  # the experts modules' CUDA graphs (runtime/shape_graphs.py), if any
        self._guards: Guards | None = None
        self._watch = watch
        self.active = True
        self.peaks: PeakWatch | None = None  # with stats=True: each forward's peak GPU memory
        # what remove() still has to do; a step that fails stays here and is retried
        self._pending: list[Step] = [("hooks", offloader.remove), ("write check", lambda: report_writes(watch)),
                                     ("weights", placement.restore),
                                     *([("expert splits", splits.restore)] if splits is not None else []),
                                     # after the forwards replaying them are gone
                                     *([("layer graphs", graphs.close)] if graphs is not None else []),
                                     ("guards", self._remove_guards),
                                     ("compile caches", reset_compiled_code), *_RELEASE_HELD]
        _ACTIVE[id(self)] = self
        hold_hook_guards()  # dynamo guards on module hooks while a plan is applied
        capture.hold()  # captures join the copies issued in them before they end
        # a model dropped while applied (never removed) gives those back when it is collected
        self._give_back = weakref.finalize(self, run_steps, list(_RELEASE_HELD))
        self._give_back.atexit = False

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return (f"<runtime.Handle {state}: {self.offloader.name} plan for '{self.plan.summary.model}' "
                f"on a {type(self.model).__name__} at 0x{id(self):x}>")

    def holds(self) -> set[int]:
        """id(param or buffer object) of every tensor whose ``.data`` is now a compute copy (the keys of
        ``true_values``, none made); empty once removed."""
        if not self.active:
            return set()
        return set(self._placement.true_values()) | (set(self._splits.true_values()) if self._splits else set())

    def true_values(self) -> dict[int, torch.Tensor]:
        """id(param or buffer object) -> its true value, for every tensor whose ``.data`` is now a
        compute copy (a prefetch slot, a UVA view, a placeholder); empty once removed."""
        if not self.active:
            return {}
        split = {key: value() for key, value in self._splits.true_values().items()} if self._splits else {}
        return self._placement.true_values() | split

    def stats(self) -> dict:
        """Per forward (the last 100): bytes copied host->GPU, copy time, stall, GB/s, and on CUDA the
        forward's peak GPU memory (``max_memory_allocated``, runtime/stats.py); with host experts on a GPU, per split
        layer the plan's host experts, how many the host computes now, the calls with fewer (the host slower than
        planned) and with more (faster), and the last measured call's GPU part, host part and hand-off in ms
        (``host_levels``, runtime/host_guard.py); with experts modules replaying CUDA graphs (split layers, and
        modules not split), their count, the graphs held, the captures failed, the bytes the graphs' static
        inputs and outputs hold and the bytes of their pool's segments (``expert_graphs``, runtime/shape_graphs.py
        ``GraphPool.counts``). ``json.dump`` of it is a STATS.json for ``planner explain --measured``
        (schemas/measured.py ``MeasuredStats``)."""
        if self.offloader.device.type == "cuda":
            torch.cuda.synchronize(self.offloader.device)
        forwards = [f.summary() for f in self.offloader.forward_stats()]
        if self.peaks is not None:
            forwards = with_peaks(forwards, list(self.peaks.peaks))
        out = {"backend": self.offloader.name, "forwards": forwards, "pinned_host_bytes": self._placement.host_bytes}
        if self._splits is not None and self._splits.guards:
            out["host_levels"] = self._splits.host_levels()
        if self._graphs is not None:
            out["expert_graphs"] = self._graphs.counts()
        return out

    def routing_stats(self, source: str = ""):
        """Per MoE layer, the tokens each routed expert received since apply (``apply(..., record_routing=True)``):
        ``schemas.routing.RoutingStats``, for ``planner plan --routing`` (save it with ``schemas.io.dump_model``)."""
        if self._routing is None:
            raise ApplyError("this plan was applied without record_routing=True: nothing was recorded")
        return self._routing.stats(self.plan.summary.model, source)

    def remove(self) -> None:
        """Restore the model. Every step runs even if one fails; then RemoveError lists what
        failed (calling remove() again retries only that). A second call is otherwise a no-op."""
        if not self._pending:
            return
        gate = self.offloader.gate
        with gate.exclusive("remove()") if gate is not None and gate.active else contextlib.nullcontext(), \
                torch.inference_mode(False):  # restored tensors are ordinary ones, whatever mode the caller is in
            self._pending, problems = run_steps(self._pending)
        if not any(step in self._pending for step in _RELEASE_HELD):
            self._give_back.detach()
        self.active = False
        _ACTIVE.pop(id(self), None)
        if problems:
            raise RemoveError(problems)
        log.info("offload removed: %d tensors restored to their original devices", len(self._placement.unique_entries()))

    def _remove_guards(self) -> None:
        if self._guards is not None:
            self._guards.remove()

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def apply(plan: Plan | str | Path | Sequence[Plan], model: nn.Module, device: str | torch.device = "cuda", *,
          stats: bool = False, progress: bool | None = None, unplanned: Unplanned = "refuse",
          spec: SpecFile | None = None, rank: int | None = None, process_group: object = None,
          read_only_buffers: bool = False, record_routing: bool = False, host_threads: int | None = None,
          host_levels: bool = True, expert_graphs: bool | None = None) -> Handle:
    """Offload ``model`` as ``plan`` says. On any error the model is left as it was.

    ``device`` is the compute device ("cuda", "cuda:1", or "cpu" to exercise a plan on a
    machine without a GPU, with synchronous copies). ``stats=True`` records CUDA events
    around copies and waits (see ``Handle.stats``); off, the hot path records nothing.
    ``unplanned``: params and persistent buffers the plan does not name are refused
    ("refuse", the default: the plan's memory promise would not hold), or put on the device
    outside the plan's accounting ("move"). ``spec``: the spec the plan was made from; its
    hash must be the plan's ``spec_sha256``.

    Offloaded tensors are read-only while applied (runtime/writes.py): a plan that offloads
    registered buffers is refused unless ``read_only_buffers=True`` (the caller vouches that the
    model never writes them), and a write to any offloaded tensor found at the end of an eager
    forward raises ``OffloadedWriteError`` instead of returning the output.

    Tensor parallelism (runtime/this_rank.py): ``plan`` may also be a directory of
    ``rank{r}.plan.yaml`` files or a list of rank plans indexed by rank; this process's rank is
    ``rank``, else its rank in ``process_group`` (default: the default group) of an initialized
    ``torch.distributed``. A rank plan must be this rank's and match the model's local shards
    (DTensor params: their local tensors and placements).

    ``record_routing=True``: count, per MoE layer, the tokens each routed expert receives
    (``Handle.routing_stats()``, runtime/routing.py). ``host_threads``: the threads torch's host kernels use while a
    plan whose host computes experts is applied (default: every CPU this process may run on). ``host_levels``: on a
    GPU, a split layer moves its split to the host's measured speed, handing experts to the link while the host is
    slower than the plan's profile and taking experts from it while faster (runtime/host_guard.py;
    ``Handle.stats()["host_levels"]``); False keeps the plan's split whatever the host does. ``expert_graphs``: on a
    GPU, the eager calls of at most 64 tokens of a split layer's experts whose GPU kernels compute (no host part),
    and of an experts module not split (resident or read through UVA) whose forward reads nothing back, replay a CUDA graph per input
    shape, captured at the shape's second call (schemas/expert_graphs.py, runtime/shape_graphs.py: the eager
    decode's launches; ``Handle.stats()["expert_graphs"]``); False runs them as launched; None (the default): as the
    plan's memory counts them (``memory.graph_bytes``: on, but where the spec's ``memory.graphs: 0`` left them out;
    on for a plan without a memory section: schemas/expert_graphs.py ``graphs_on``), which is what the planner's
    eager predictions price.
    """
    who = this_rank(rank, process_group)
    plan, loaded = choose_plan(plan, who)  # a loaded file has had every check of the plan file already
    if not isinstance(model, nn.Module):
        raise ApplyError(f"apply() needs the nn.Module to offload, got a {type(model).__name__}")
    if unplanned not in UNPLANNED_CHOICES:
        raise ApplyError(f"unplanned={unplanned!r}: expected one of {', '.join(map(repr, UNPLANNED_CHOICES))}")
    if spec is not None and not isinstance(spec, SpecFile):
        raise ApplyError(f"spec= takes the SpecFile the plan was made from, got a {type(spec).__name__}")
    refuse_if_applied(model)
    with torch.inference_mode(False):  # buffers and host copies made here are used outside inference mode too
        return _apply(plan, loaded, who, model, device, stats=stats, progress=progress, unplanned=unplanned,
                      spec=spec, read_only_buffers=read_only_buffers, record_routing=record_routing,
                      host_threads=host_threads, host_levels=host_levels, expert_graphs=expert_graphs)


def graphs_counted(plan: Plan) -> bool:
    """Whether ``plan``'s memory counts the layer graphs (``memory.graph_bytes``; a plan without a memory section,
    written before it, is taken to): schemas/expert_graphs.py ``graphs_on``, the rule the cost model prices by."""
    return graphs_on(plan.memory)


def _apply(plan: Plan, loaded: bool, who, model: nn.Module, device: str | torch.device, *, stats: bool,
           progress: bool | None, unplanned: Unplanned, spec: SpecFile | None, read_only_buffers: bool,
           record_routing: bool, host_threads: int | None, host_levels: bool, expert_graphs: bool | None) -> Handle:
    device = _device(device)
    meta = meta_tensors(model)
    if meta:
        raise ApplyError(f"{len(meta)} params/buffers are on the meta device and hold no data: "
                         f"{', '.join(meta[:5])}{' …' if len(meta) > 5 else ''}")
    checked = check(plan, model, unplanned=unplanned, spec=spec, loaded=loaded, who=who, device=device,
                    read_only_buffers=read_only_buffers)  # every name of the plan found once: checked.refs
    _refuse_held_elsewhere([*checked.refs.values(), *(t.ref for t in checked.loose)])
    if record_routing and not experts_modules(model, (layer.name for layer in plan.layers)):
        raise ApplyError("record_routing=True, but no layer of the plan holds an experts module (forward("
                         "hidden_states, top_k_index, top_k_weights), as transformers 5 writes MoE experts): "
                         "there is no routing to record")
    reset_compiled_code()
    _check_device_memory(plan, checked.refs, device)

    placement = Placement()
    if host_threads is not None and (type(host_threads) is not int or host_threads < 1):
        raise ApplyError(f"host_threads={host_threads!r}: expected a whole number of threads, 1 or more")
    if type(host_levels) is not bool:
        raise ApplyError(f"host_levels={host_levels!r}: expected True or False")
    if expert_graphs is not None and type(expert_graphs) is not bool:
        raise ApplyError(f"expert_graphs={expert_graphs!r}: expected True, False or None (as the plan counts them)")
    if expert_graphs is None:
        expert_graphs = graphs_counted(plan)
    # the applied plan's layer graphs (runtime/shape_graphs.py), where calls can replay them
    graphs = GraphPool(device) if expert_graphs and graphs_here(device) else None
    splits = ExpertSplits(device, host_threads=host_threads, guarded=host_levels, pool=graphs)
    tall = ExpertsForwards(graphs)
    pin = device.type == "cuda"
    moved = Progress(plan.summary.total_bytes, "apply offload plan", progress)
    offloader = handle = None
    try:
        placement.group([*checked.refs.values(), *(t.ref for t in checked.loose)])  # views of one storage move as one
        offloaded: list[Offloaded] = []
        for layer in plan.layers:  # offload first: frees GPU memory when the model starts there
            by_expert = set(layer.experts.params) if layer.experts is not None else set()
            if len(layer.offloaded) > len(by_expert):
                offloaded += placement.offload_layer([checked.ref(layer.name, r) for r in layer.offloaded
                                                      if r not in by_expert], pin)
                moved.advance(layer.offloaded_bytes)
        for layer in plan.layers:
            for rel in layer.params:
                if rel not in layer.offloaded:
                    placement.move(checked.ref(layer.name, rel), device)
                    if rel not in layer.tied:  # a tied param is counted once, at its owner
                        moved.advance(layer.params[rel].bytes)
        n_loose = _move_unplanned(checked.loose, placement, device)
        splits.build(plan, model, pin)
        offloader = make_offloader(_link_backend(plan), plan=plan, model=model, device=device,
                                   offloaded=offloaded, collect_stats=stats)
        offloader.wrap_modules()
        splits.attach(offloader.gate)
        tall.install(plan, model)
        offloader.post_init()
        watch = WriteWatch.of(offloader, backend_of_each(offloader))  # versions after every .data swap
        watch.install(model, offloader)
        if isinstance(offloader, PrefetchOffloader):
            offloader.on_bump = watch.expect  # its refills' version bumps are not the model's writes
        handle = Handle(plan, model, offloader, placement, watch, splits if splits.params else None,
                        graphs if graphs is not None and graphs.members else None)
        if tall.forwards:
            handle._pending.insert(0, ("experts modules' forwards", tall.restore))
        if stats:
            handle.peaks = PeakWatch(device)
            handle.peaks.install(model, offloader.hooks)
        if record_routing:
            handle._routing = RoutingRecorder()
            handle._pending.insert(0, ("routing hooks", handle._routing.remove))
            for layer, module in experts_modules(model, (layer.name for layer in plan.layers)):
                handle._routing.watch(layer, module)
        handle._guards = install(handle, model, placement.true_values() | splits.true_values())
    except BaseException as exc:
        steps: list[Step] = [("hooks", offloader.remove)] if offloader is not None else []
        if handle is not None:  # it holds the dynamo and capture settings: give them back
            _ACTIVE.pop(id(handle), None)
            handle._give_back.detach()
            steps += _RELEASE_HELD
        _, problems = run_steps(steps + [("experts modules' forwards", tall.restore), ("weights", placement.restore),
                                         ("expert splits", splits.restore),
                                         *([("layer graphs", graphs.close)] if graphs is not None else [])])
        if problems:  # the original error is what the caller needs; say what could not be undone
            log.error("apply failed and its rollback could not undo everything:\n%s", "\n".join(problems))
            exc.add_note("rollback problems: " + "; ".join(problems)) if hasattr(exc, "add_note") else None
        raise
    finally:
        moved.close()
    s = plan.summary
    log.info("offload applied (%s): %d params resident on %s (%s), %d offloaded to %s host memory (%s), "
             "buffer pool %s, %d unplanned tensors moved", offloader.name,
             sum(len(layer.params) - len(layer.offloaded) for layer in plan.layers), device,
             format_bytes(s.resident_bytes), len(offloaded), "pinned" if pin else "plain",
             format_bytes(placement.host_bytes), format_bytes(s.buffer_bytes), n_loose)
    return handle


def _refuse_held_elsewhere(refs) -> None:
    """Raise when a tensor of this model is offloaded by a plan applied to another model (two models sharing
    one nn.Parameter object): its ``.data`` is that plan's compute copy, not its value."""
    holders = {key: h for h in list(_ACTIVE.values()) for key in h.holds()}
    clash = [(ref.full.lstrip("."), holders.get(id(ref.tensor)) or holders.get(id(ref.local))) for ref in refs]
    clash = [(name, h) for name, h in clash if h is not None]
    if clash:
        names = ", ".join(name for name, _ in clash[:5]) + (" …" if len(clash) > 5 else "")
        raise ApplyError(f"cannot apply: {len(clash)} of this model's tensors ({names}) are the very tensor objects "
                         f"of another model that {clash[0][1]!r} offloads, so they hold that plan's compute copies, not "
                         "their values; remove that plan first, or give this model tensors of its own")


BACKENDS: dict[str, type[Offloader]] = {"none": NoOffloader, "uva": UvaOffloader, "prefetch": PrefetchOffloader,
                                         "mixed": MixedOffloader, "cpu": CpuOffloader}


def _link_backend(plan: Plan) -> str:
    """The offloader of the plan's link: its backend, save a mixed plan that prefetches nothing (UVA params
    and experts the host computes), which the cpu offloader runs."""
    backend = plan.summary.backend
    return "cpu" if backend == "mixed" and plan.buffer_pool is None else backend


def make_offloader(backend: str, **kwargs) -> Offloader:
    """The offloader of a plan's backend (runtime/uva.py; runtime/prefetch.py: prefetch and mixed;
    runtime/cpu_experts.py: experts the host computes beside UVA params)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend '{backend}'; expected {', '.join(BACKENDS)}")
    return BACKENDS[backend](**kwargs)


def _device(device: str | torch.device) -> torch.device:
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ApplyError(f"unsupported device {device!r}: use 'cuda', 'cuda:N' or 'cpu'") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ApplyError("the plan is for a CUDA device but CUDA is not available here; "
                             "pass device='cpu' to exercise the plan on the CPU")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= torch.cuda.device_count():
            raise ApplyError(f"device '{device}' does not exist: this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        raise ApplyError(f"unsupported device '{device}': use 'cuda', 'cuda:N' or 'cpu'")
    return device


def _check_device_memory(plan: Plan, refs: Refs, device: torch.device) -> None:
    if device.type != "cuda":
        return
    offloaded = {(layer.name, r) for layer in plan.layers for r in layer.offloaded}
    spans: dict[tuple, tuple[int, int]] = {}  # storage -> the bytes its resident views span
    for key, ref in refs.items():
        t = ref.local
        if key in offloaded or t.device == device:
            continue
        a, b = extent(t)
        lo, hi = spans.get(storage_key(t), (a, b))
        spans[storage_key(t)] = (min(lo, a), max(hi, b))
    need = plan.summary.buffer_bytes + sum(hi - lo for lo, hi in spans.values()) + split_gpu_bytes(plan)
    free, _total = torch.cuda.mem_get_info(device)
    if need > free:
        raise ApplyError(f"the plan needs {format_bytes(need)} more on {device} but only "
                         f"{format_bytes(free)} is free")


def _move_unplanned(loose: list[Loose], placement: Placement, device: torch.device) -> int:
    """Tensors the plan does not name (non-persistent buffers such as rotary tables; with
    unplanned="move" also params) go to the device too, tracked by the placement so that
    remove() (or a rollback) brings them back; returns how many moved."""
    moved = unplanned_params = 0
    for t in loose:
        if not t.ref.is_buffer:
            unplanned_params += t.nbytes
        moved += placement.move(t.ref, device)
    if unplanned_params:
        log.warning("the model has %s of parameters the plan does not name; they were put on %s "
                    "and are not in the plan's memory accounting", format_bytes(unplanned_params), device)
    return moved
