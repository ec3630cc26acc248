"""Runtime misuse: call sequences that must raise and leave the model exactly as it was.

Each case builds a small Llama (optionally with a plan applied to it), makes one wrong
call, and its ``after`` check proves nothing changed: while a plan is still applied the
model computes the original outputs and ``state_dict()`` holds the original values;
after ``remove()`` (or when nothing was applied) every tensor, Parameter object, module
attribute and hook table is as before.
"""

from __future__ import annotations

import copy
import io
import pickle
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
from model_state import differences, snapshot
from models import Llama, LlamaConfig, make_llama

import planner
import runtime
from corpus.case import ApiCase
from runtime.errors import ApplyError, PlanMismatchError
from schemas.errors import InputError
from runtime.guard import AppliedModelError
from schemas import Plan

IDS = torch.randint(0, 60, (2, 5), generator=torch.Generator().manual_seed(3))


def _cfg(layers: int) -> LlamaConfig:
    return LlamaConfig(vocab=64, dim=32, layers=layers, heads=4, kv_heads=2, hidden=48)


@lru_cache(maxsize=None)
def _plan(layers: int = 3, backend: str = "prefetch", part: str = "") -> Plan:
    model = make_llama(_cfg(layers))
    target = model.get_submodule(part) if part else model
    return planner.plan(runtime.describe(target), strategy="group", group_size=2, num_in_group=1,
                        prefetch_step=1, backend=backend)


@dataclass
class _Scene:
    model: torch.nn.Module
    snap: dict
    want: torch.Tensor
    handles: list = field(default_factory=list)


_SCENES: dict[Path, _Scene] = {}


def _scene(tmp: Path, layers: int = 3, applied: str | None = None, part: str = "") -> _Scene:
    """A fresh model (its snapshot and outputs taken first), with a plan applied when asked."""
    model = make_llama(_cfg(layers))
    with torch.no_grad():
        want = model(IDS)
    scene = _SCENES[tmp] = _Scene(model, snapshot(model), want)
    if applied:
        target = model.get_submodule(part) if part else model
        scene.handles.append(runtime.apply(_plan(layers, applied, part), target, device="cpu"))
    return scene


def _exact(tmp: Path) -> None:
    scene = _SCENES.pop(tmp)
    model = scene.model
    if scene.handles:  # still applied: right outputs, true state_dict
        with torch.no_grad():
            assert torch.equal(model(IDS), scene.want), "outputs changed while applied"
        state = model.state_dict()
        wrong = [k for k, (_, value, *_) in scene.snap["tensors"].items() if not torch.equal(state[k], value)]
        assert not wrong, f"state_dict() while applied holds wrong values: {wrong[:5]}"
        for h in reversed(scene.handles):
            h.remove()
    problems = differences(model, scene.snap, same_storage=not scene.handles)
    assert not problems, "\n".join(problems)
    with torch.no_grad():
        assert torch.equal(model(IDS), scene.want), "outputs changed"


def _misuse(id: str, action, *, backend: str = "prefetch", expect: tuple[str, ...] = (),
            error=AppliedModelError) -> ApiCase:
    """``action(model)`` on a model with a ``backend`` plan applied must raise ``error``."""

    def call(tmp: Path):
        return action(_scene(tmp, applied=backend).model)

    return ApiCase(id=f"runtime-{id}", call=call, error=error, expect=expect, after=_exact)


def _refused(id: str, action, *, layers: int = 3, expect: tuple[str, ...] = (), error=PlanMismatchError) -> ApiCase:
    """``action(model, tmp)`` on a fresh, un-applied model must raise ``error``; nothing moves."""

    def call(tmp: Path):
        return action(_scene(tmp, layers=layers).model, tmp)

    return ApiCase(id=f"runtime-{id}", call=call, error=error, expect=expect, after=_exact)


def _apply(model, plan=None, **kw):
    return runtime.apply(plan if plan is not None else _plan(), model, device=kw.pop("device", "cpu"), **kw)


# -- plans that do not fit a model ----------------------------------------------------------

def _layer_twice(model, _tmp):
    plan = _plan()
    return _apply(model, Plan.model_construct(**{**dict(plan), "layers": plan.layers + [plan.layers[1]]}))


def _offloaded_twice(model, _tmp):
    plan = _plan()
    i = next(i for i, layer in enumerate(plan.layers) if layer.offloaded)
    layer = plan.layers[i]
    twice = layer.model_construct(**{**dict(layer), "offloaded": layer.offloaded + layer.offloaded[:1]})
    return _apply(model, Plan.model_construct(**{**dict(plan), "layers": [*plan.layers[:i], twice, *plan.layers[i + 1:]]}))


def _nested_layer_names_same_tensor(model, _tmp):
    plan = _plan()
    block = plan.layer("model.layers.0")
    inner = block.model_construct(name="model.layers.0.mlp",
                                  params={"up_proj.weight": block.params["mlp.up_proj.weight"]},
                                  tied={}, offloaded=[], resident_bytes=block.params["mlp.up_proj.weight"].bytes,
                                  offloaded_bytes=0, prefetch=None)
    n, s = inner.resident_bytes, plan.summary  # a plan consistent in itself: only the model shows the clash
    summary = s.model_copy(update={"layers": s.layers + 1, "total_bytes": s.total_bytes + n,
                                   "resident_bytes": s.resident_bytes + n, "peak_gpu_bytes": s.peak_gpu_bytes + n})
    return _apply(model, Plan.model_construct(**{**dict(plan), "summary": summary,
                                                 "layers": [plan.layers[0], inner, *plan.layers[1:]]}))


def _extra_root_param(model, _tmp):
    model.register_parameter("temperature", torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16)))
    _SCENES[_tmp].snap = snapshot(model)
    return _apply(model)


def _extra_block_buffer(model, _tmp):
    model.model.layers[2].register_buffer("lora_scale", torch.full((32,), 0.5, dtype=torch.bfloat16))
    _SCENES[_tmp].snap = snapshot(model)
    return _apply(model)


def _meta_buffer(model, _tmp):
    model.model.layers[0].register_buffer("rope", torch.empty(8, device="meta"), persistent=False)
    _SCENES[_tmp].snap = snapshot(model)
    return _apply(model)


def _converted_after_planning(model, _tmp):
    model.half()
    _SCENES[_tmp].snap = snapshot(model)
    with torch.no_grad():
        _SCENES[_tmp].want = model(IDS)
    return _apply(model)


def _meta_model(_tmp):
    with torch.device("meta"):
        model = Llama(_cfg(3)).to(torch.bfloat16)
    return runtime.apply(_plan(), model, device="cpu")


# -- applying twice ---------------------------------------------------------------------------

def _backbone_then_whole(tmp):
    scene = _scene(tmp, applied="uva", part="model")
    return _apply(scene.model)


def _whole_then_backbone(tmp):
    scene = _scene(tmp, applied="prefetch")
    return _apply(scene.model.model, _plan(3, "uva", "model"))


def _whole_then_block(tmp):
    scene = _scene(tmp, applied="uva")
    block = scene.model.model.layers[1]
    container = torch.nn.Sequential(block)
    return _apply(container, planner.plan(runtime.describe(container), backend="none"))


CASES: list[ApiCase] = [
    # while applied: conversions, copies and loads are refused before anything changes
    _misuse("double-apply", lambda m: _apply(m), expect=("already offloaded", "remove()")),
    _misuse("double-apply-other-backend", lambda m: _apply(m, _plan(3, "uva")), expect=("already offloaded",)),
    _misuse("half-while-applied", lambda m: m.half(), expect=("dtype or device", "remove()")),
    _misuse("to-float64-while-applied", lambda m: m.to(torch.float64), expect=("dtype or device",)),
    _misuse("float-on-a-block-while-applied", lambda m: m.model.layers[1].float(),
            expect=("'model.layers.1' is part of a model",)),
    _misuse("cpu-while-applied-on-cpu", lambda m: m.cpu(), expect=("dtype or device",)),
    _misuse("cuda-while-applied", lambda m: m.cuda(), expect=("dtype or device",)),
    _misuse("half-while-uva-applied", lambda m: m.half(), backend="uva", expect=("uva plan",)),
    _misuse("to-empty-while-applied", lambda m: m.to_empty(device="cpu"), expect=("dtype or device",)),
    _misuse("share-memory-while-applied", lambda m: m.share_memory(), backend="uva"),
    _misuse("load-state-dict-while-applied", lambda m: m.load_state_dict(make_llama(_cfg(3), seed=9).state_dict()),
            expect=("load a state dict",)),
    _misuse("load-state-dict-into-a-block-while-applied",
            lambda m: m.model.layers[1].load_state_dict(make_llama(_cfg(3), seed=9).model.layers[1].state_dict()),
            expect=("load a state dict", "model.layers.1")),
    _misuse("load-state-dict-assign-while-applied",
            lambda m: m.load_state_dict(make_llama(_cfg(3), seed=9).state_dict(), assign=True), backend="uva"),
    _misuse("state-dict-keep-vars-while-applied", lambda m: m.state_dict(keep_vars=True), expect=("keep_vars",)),
    _misuse("deepcopy-while-applied", lambda m: copy.deepcopy(m), expect=("copy.deepcopy",)),
    _misuse("shallow-copy-while-applied", lambda m: copy.copy(m), expect=("pickle",)),
    _misuse("pickle-while-applied", lambda m: pickle.dumps(m), backend="uva", expect=("pickle",)),
    _misuse("torch-save-while-applied", lambda m: torch.save(m, io.BytesIO()), expect=("torch.save",)),
    ApiCase("runtime-apply-whole-over-applied-backbone", _backbone_then_whole, AppliedModelError,
            ("its submodule 'model' is already offloaded",), _exact),
    ApiCase("runtime-apply-backbone-of-applied-model", _whole_then_backbone, AppliedModelError,
            ("the submodule 'model' of a model",), _exact),
    ApiCase("runtime-apply-block-of-applied-model-in-a-new-container", _whole_then_block, AppliedModelError,
            ("already offloaded",), _exact),
    # plans that do not cover the model exactly once
    _refused("plan-for-a-smaller-model", lambda m, t: _apply(m), layers=6,
             expect=("not in the plan", "model.layers.3", "unplanned='move'")),
    _refused("unplanned-root-param", _extra_root_param, expect=("temperature", "unplanned='move'")),
    _refused("unplanned-persistent-buffer", _extra_block_buffer, expect=("model.layers.2.lora_scale",)),
    _refused("plan-lists-a-layer-twice", _layer_twice, error=(InputError, PlanMismatchError),
             expect=("model.layers.0",)),
    _refused("plan-offloads-a-param-twice", _offloaded_twice, error=(InputError, PlanMismatchError),
             expect=("self_attn.q_proj.weight",)),
    _refused("plan-names-a-tensor-under-two-layers", _nested_layer_names_same_tensor,
             expect=("model.layers.0.mlp.up_proj.weight", "same tensor")),
    _refused("plan-from-another-spec", lambda m, t: _apply(m, spec=runtime.describe(make_llama(_cfg(4)))),
             expect=("another spec", "spec_sha256")),
    _refused("plan-for-the-model-before-half", _converted_after_planning,
             expect=("dtype float16 in the model, bfloat16 in the plan",)),
    _refused("meta-buffer", _meta_buffer, error=ApplyError, expect=("meta device", "model.layers.0.rope")),
    # arguments of the wrong kind
    _refused("device-gpu-string", lambda m, t: _apply(m, device="gpu"), error=ApplyError,
             expect=("unsupported device 'gpu'",)),
    _refused("device-meta", lambda m, t: _apply(m, device="meta"), error=ApplyError, expect=("unsupported device",)),
    _refused("device-cuda-index-out-of-range", lambda m, t: _apply(m, device="cuda:99"), error=ApplyError,
             expect=("CUDA",)),
    _refused("unplanned-unknown-choice", lambda m, t: _apply(m, unplanned="keep"), error=ApplyError,
             expect=("unplanned='keep'", "'refuse', 'move'")),
    _refused("spec-passed-as-plan", lambda m, t: _apply(m, runtime.describe(m)), error=ApplyError,
             expect=("that is a spec",)),
    _refused("state-dict-passed-as-model", lambda m, t: runtime.apply(_plan(), m.state_dict(), device="cpu"),
             error=ApplyError, expect=("nn.Module", "OrderedDict")),
    _refused("spec-keyword-not-a-spec", lambda m, t: _apply(m, spec="model.yaml"), error=ApplyError,
             expect=("SpecFile",)),
    ApiCase("runtime-meta-model", _meta_model, ApplyError, ("meta device", "model.embed_tokens.weight")),
]
