"""Plan files that contradict themselves: hand edits of derived fields, refused with the field named.

Every case starts from a plan the planner made (prefetch, uva or none over a small spec with a
tied head and a strided param), changes what a person editing the file might change, and
expects exit 2 (CLI) or an error before anything moves (runtime.apply), naming the field and
both values. ``valid_plan_data`` is shared with tests/test_plan_check.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from corpus.case import ApiCase, CliCase
from schemas import InputError, SpecFile
from schemas.io import parse_text
from schemas.yaml_write import dump_yaml

SPEC_TEXT = """\
model:
  name: tiny-tied
  dtype: float16
  layers:
    - name: embed
      params:
        weight: [64, 8]
    - name: blocks.{i}
      repeat: 6
      params:
        attn.qkv: [24, 8]
        mlp.w1: [16, 8]
        mlp.w2: {shape: [8, 16], stride: [1, 16]}
        norm.weight: [8]
    - name: head
      tied:
        weight: embed.weight
memory: {workspace: 0, activations: 0}  # a toy model: its plans count weights and buffers alone
"""

# the planner's settings for each plan the cases start from
SETTINGS: dict[str, dict[str, Any]] = {
    # blocks.1, 2, 4, 5 offloaded, two slots; blocks.1 and blocks.2 wrap around to the previous forward
    "prefetch": {"strategy": "group", "group_size": 3, "num_in_group": 2, "prefetch_step": 2, "backend": "prefetch"},
    "uva": {"gpu_budget": 3000, "backend": "uva", "strategy": "budget"},  # a plan that keeps some blocks resident
    "none": {"backend": "none", "gpu_budget": 8000},
}


@cache
def _plan_json(kind: str) -> str:
    import planner
    from schemas.io import plan_data

    spec = SpecFile.model_validate(parse_text(SPEC_TEXT, "spec"))
    return json.dumps(plan_data(planner.plan(spec, **SETTINGS[kind])))


def valid_plan_data(kind: str = "prefetch") -> dict[str, Any]:
    """A fresh copy of the data of a valid plan (``kind``: prefetch, uva or none)."""
    return json.loads(_plan_json(kind))


Edit = Callable[[dict[str, Any]], None]


def edited(kind: str, edit: Edit, fmt: str = "yaml") -> Callable[[], str]:
    """The text of the ``kind`` plan after ``edit`` (made lazily: planning happens when a case runs)."""
    def text() -> str:
        data = valid_plan_data(kind)
        edit(data)
        return json.dumps(data, indent=1) if fmt == "json" else dump_yaml(data)
    return text


def setter(path: str, value: Any) -> Edit:
    """An edit setting ``path`` (keys and list indexes separated by '/') to ``value``."""
    *parents, last = path.split("/")

    def edit(data: dict[str, Any]) -> None:
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


def edits(*steps: Edit) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        for step in steps:
            step(data)
    return edit


def _file_case(id: str, command: str, kind: str, edit: Edit, expect: tuple[str, ...], fmt: str = "yaml") -> CliCase:
    text = edited(kind, edit, fmt)
    name = "bad.json" if fmt == "json" else "bad.yaml"

    def setup(d: Path) -> None:
        (d / name).write_text(text())
        (d / "good.yaml").write_text(dump_yaml(valid_plan_data(kind)))

    args = {"validate": ("validate", f"{{d}}/{name}"), "show": ("show", f"{{d}}/{name}"),
            "diff": ("diff", "{d}/good.yaml", f"{{d}}/{name}")}[command]
    return CliCase(id=id, args=args, setup=setup, exit=2, expect=(name, *expect))


def _off_blocks(data: dict[str, Any]) -> None:  # a uva plan whose blocks.3 offloads nothing
    layer = data["layers"][4]
    layer["offloaded"], layer["resident_bytes"], layer["offloaded_bytes"] = [], 1152, 0
    layer.pop("uva", None)


CASES: list[CliCase | ApiCase] = [
    # -- plan fields are strict: a quoted number, a float, a yes/no word or a 0/1 is not a value ------------
    _file_case("plan-bytes-quoted", "validate", "prefetch", setter("layers/2/params/mlp.w1/bytes", "256"),
               ("layers[2].params['mlp.w1'].bytes: expected a whole number (got '256')",)),
    _file_case("plan-total-as-float", "show", "uva", setter("summary/total_bytes", 8960.0),
               ("summary.total_bytes: expected a whole number (got 8960.0)",)),
    _file_case("plan-previous-forward-yes", "validate", "prefetch", setter("layers/2/prefetch/previous_forward", "yes"),
               ("layers[2].prefetch.previous_forward: input should be a valid boolean (got 'yes')",)),
    _file_case("plan-buffer-flag-as-1", "diff", "prefetch", setter("layers/2/params/mlp.w1/buffer", 1),
               ("layers[2].params['mlp.w1'].buffer: input should be a valid boolean (got 1)",)),
    _file_case("plan-slot-as-true", "validate", "prefetch", setter("layers/2/prefetch/slot", True),
               ("layers[2].prefetch.slot",)),
    # -- param sizes and dtypes ---------------------------------------------------------------
    _file_case("plan-param-bytes-1", "validate", "prefetch", setter("layers/2/params/mlp.w1/bytes", 1),
               ("layers[2].params['mlp.w1'].bytes: 1 in the file, 256 from shape [16, 8], dtype float16",)),
    _file_case("plan-strided-param-bytes-as-contiguous", "show", "prefetch", setter("layers/1/params/mlp.w2/bytes", 256),
               ("layers[1].params['mlp.w2'].bytes: 256 in the file, 496 from shape [8, 16], dtype float16, "
                "stride [1, 16]",)),
    _file_case("plan-dtype-typo", "validate", "uva", setter("layers/0/params/weight/dtype", "bfloat61"),
               ("layers[0].params.weight.dtype", "unknown dtype 'bfloat61'", "did you mean 'bfloat16'")),
    _file_case("plan-dtype-short-form", "validate", "none", setter("layers/0/params/weight/dtype", "fp16"),
               ("layers[0].params.weight.dtype", "'fp16' is a short form", "'float16'")),
    _file_case("plan-stride-rank", "validate", "uva", setter("layers/4/params/mlp.w2/stride", [16]),
               ("layers[4].params['mlp.w2'].stride", "has 1 entries but shape [8, 16] has 2")),
    _file_case("plan-shape-grown-bytes-kept", "validate", "prefetch", setter("layers/3/params/attn.qkv/shape", [32, 8]),
               ("layers[3].params['attn.qkv'].bytes: 384 in the file, 512 from shape [32, 8]",)),
    # -- per-layer and summary totals ---------------------------------------------------------
    _file_case("plan-layer-resident-bytes", "validate", "prefetch", setter("layers/1/resident_bytes", 1000),
               ("layers[1].resident_bytes: 1000 in the file, 1152 from",)),
    _file_case("plan-layer-offloaded-bytes", "diff", "prefetch", setter("layers/2/offloaded_bytes", 1100),
               ("layers[2].offloaded_bytes: 1100 in the file, 1152 from the bytes of its offloaded params",)),
    _file_case("plan-tied-counted-twice", "validate", "uva", setter("layers/7/resident_bytes", 1024),
               ("layers[7].resident_bytes: 1024 in the file, 0 from", "tied params count at their owner")),
    _file_case("plan-total-bytes", "validate", "uva", setter("summary/total_bytes", 8960),
               ("summary.total_bytes: 8960 in the file, 7936 from",)),
    _file_case("plan-peak-is-a-lie", "show", "prefetch", setter("summary/peak_gpu_bytes", 4000),
               ("summary.peak_gpu_bytes: 4000 in the file, 5632 from resident_bytes 3328 + buffer_bytes 2304",)),
    _file_case("plan-layer-count", "validate", "none", setter("summary/layers", 7),
               ("summary.layers: 7 in the file, 8 from the layers listed",)),
    _file_case("plan-offloaded-layer-count", "validate", "uva", setter("summary/offloaded_layers", 4),
               ("summary.offloaded_layers: 4 in the file, 5 from",)),
    _file_case("plan-pinned-host-bytes", "validate", "uva", setter("summary/pinned_host_bytes", 0),
               ("summary.pinned_host_bytes: 0 in the file, 5760 from",)),
    _file_case("plan-buffer-bytes", "validate", "prefetch", setter("summary/buffer_bytes", 0),
               ("summary.buffer_bytes: 0 in the file, 2304 from",)),
    _file_case("plan-resident-bytes-json", "validate", "prefetch", setter("summary/resident_bytes", 7936),
               ("summary.resident_bytes: 7936 in the file, 3328 from",), fmt="json"),
    # -- budgets ------------------------------------------------------------------------------
    _file_case("plan-uva-over-its-budget", "validate", "uva", setter("summary/gpu_budget_bytes", 2000),
               ("summary.peak_gpu_bytes", "the peak (2176 bytes) is larger than the plan's GPU budget",
                "gpu_budget_bytes: 2000")),
    _file_case("plan-uva-more-resident-than-budget", "validate", "uva", _off_blocks,
               ("summary.peak_gpu_bytes: 2176 in the file, 3328 from", "the peak (3328 bytes) is larger")),
    _file_case("plan-pool-over-budget", "validate", "prefetch", setter("summary/gpu_budget_bytes", 2000),
               ("buffer_pool.bytes", "the buffer pool alone (2304 bytes) is larger than the plan's GPU budget",)),
    _file_case("plan-pinned-over-cpu-budget", "validate", "uva", setter("summary/cpu_budget_bytes", 4096),
               ("summary.pinned_host_bytes", "(5760 bytes) is larger than the plan's host budget",
                "cpu_budget_bytes: 4096")),
    # -- backend consistency ------------------------------------------------------------------
    _file_case("plan-backend-none-with-offloaded", "validate", "uva", setter("summary/backend", "none"),
               ("summary.backend", "'none' keeps every param on the GPU, but 5 layer(s) offload params",)),
    _file_case("plan-backend-none-keeps-pool", "show", "prefetch", setter("summary/backend", "none"),
               ("buffer_pool: backend 'none' has no buffer pool", "layers[2].prefetch: a prefetch entry, but the "
                "backend is 'none'", "summary.prefetch_step")),
    _file_case("plan-uva-with-prefetch-entries", "validate", "prefetch", setter("summary/backend", "uva"),
               ("layers[5].prefetch: a prefetch entry, but the backend is 'uva'", "buffer_pool: backend 'uva'")),
    _file_case("plan-uva-with-step", "validate", "uva", setter("summary/prefetch_step", 2),
               ("summary.prefetch_step: 2, but only the prefetch backend",)),
    _file_case("plan-prefetch-entry-missing", "validate", "prefetch", setter("layers/5/prefetch", None),
               ("layers[5].prefetch: the layer offloads params under the prefetch backend but has no prefetch entry",)),
    _file_case("plan-prefetch-entry-on-resident-layer", "validate", "prefetch",
               setter("layers/4/prefetch", {"slot": 0, "copy_before": "blocks.2"}),
               ("layers[4].prefetch: a prefetch entry, but the layer offloads nothing",)),
    # -- the schedule ------------------------------------------------------------------------
    _file_case("plan-step-zero", "validate", "prefetch", setter("summary/prefetch_step", 0),
               ("summary.prefetch_step: must be >= 1 (got 0)",)),
    _file_case("plan-step-huge", "validate", "prefetch", setter("summary/prefetch_step", 10**30),
               ("summary.prefetch_step: must be at most 2^63-1 (got a 100-bit number)",)),
    _file_case("plan-step-missing", "validate", "prefetch", setter("summary/prefetch_step", None),
               ("summary.prefetch_step: the prefetch backend with offloaded layers needs a prefetch_step",)),
    _file_case("plan-copy-before-itself", "validate", "prefetch", setter("layers/5/prefetch/copy_before", "blocks.4"),
               ("layers[5].prefetch.copy_before: 'blocks.4' in the file, 'blocks.2' from the schedule of "
                "prefetch_step 2 over 4 offloaded layers in 2 slots",)),
    _file_case("plan-copy-before-later-layer", "diff", "prefetch", setter("layers/3/prefetch/copy_before", "blocks.5"),
               ("layers[3].prefetch.copy_before: 'blocks.5' in the file, 'head' from",)),
    _file_case("plan-copy-before-unknown-layer", "validate", "prefetch",
               setter("layers/6/prefetch/copy_before", "blocks.40"),
               ("layers[6].prefetch.copy_before: 'blocks.40' in the file, 'blocks.3' from",)),
    _file_case("plan-four-layers-one-slot", "validate", "prefetch",
               edits(setter("layers/3/prefetch/slot", 0), setter("layers/6/prefetch/slot", 0)),
               ("layers[3].prefetch.slot: 0 in the file, 1 from", "layers[6].prefetch.slot: 0 in the file, 1 from")),
    _file_case("plan-slot-outside-pool", "validate", "prefetch", setter("layers/5/prefetch/slot", 7),
               ("layers[5].prefetch.slot: 7 in the file, 0 from",)),
    _file_case("plan-previous-forward-dropped", "validate", "prefetch",
               setter("layers/2/prefetch/previous_forward", False),
               ("layers[2].prefetch.previous_forward: False in the file, True from",)),
    # -- the buffer pool ---------------------------------------------------------------------
    _file_case("plan-pool-bytes", "validate", "prefetch", setter("buffer_pool/bytes", 1152),
               ("buffer_pool.bytes: 1152 in the file, 2304 from the buffers the offloaded layers need",)),
    _file_case("plan-pool-slots", "validate", "prefetch", setter("buffer_pool/slots", 3),
               ("buffer_pool.slots: 3 in the file, 2 from",)),
    _file_case("plan-pool-key-dropped", "validate", "prefetch",
               lambda d: d["buffer_pool"]["keys"].pop(1),
               ("buffer_pool.keys: missing buffers the offloaded layers need: mlp.w1 [16, 8] float16",)),
    _file_case("plan-pool-key-wrong-dtype", "show", "prefetch", setter("buffer_pool/keys/0/dtype", "bfloat16"),
               ("buffer_pool.keys[0]: no offloaded param needs a buffer attn.qkv [24, 8] bfloat16",
                "missing buffers the offloaded layers need: attn.qkv [24, 8] float16")),
    _file_case("plan-pool-key-stride-lost", "validate", "prefetch", setter("buffer_pool/keys/2/stride", None),
               ("buffer_pool.keys[2]: no offloaded param needs a buffer mlp.w2 [8, 16] float16",)),
    _file_case("plan-pool-key-one-slot", "validate", "prefetch", setter("buffer_pool/keys/3/slots", [0]),
               ("buffer_pool.keys[3].slots: [0] in the file, [0, 1] from",)),
    _file_case("plan-pool-key-twice", "validate", "prefetch",
               lambda d: d["buffer_pool"]["keys"].append(dict(d["buffer_pool"]["keys"][0])),
               ("buffer_pool.keys[4]: buffer attn.qkv [24, 8] float16 is listed more than once",)),
    _file_case("plan-pool-keys-reordered", "validate", "prefetch",
               lambda d: d["buffer_pool"]["keys"].reverse(),
               ("buffer_pool.keys: keys are not in order",)),
    # -- offloaded lists and ties -------------------------------------------------------------
    _file_case("plan-offloaded-twice", "validate", "uva", lambda d: d["layers"][2]["offloaded"].append("mlp.w1"),
               ("layers[2].offloaded[4]: 'mlp.w1' is listed more than once",)),
    _file_case("plan-offloaded-unknown", "validate", "uva", setter("layers/2/offloaded/1", "mlp.w3"),
               ("layers[2].offloaded[1]: 'mlp.w3' is not a param of this layer (did you mean 'mlp.w",)),
    _file_case("plan-offloaded-tied-param", "validate", "uva",
               edits(setter("layers/7/offloaded", ["weight"]), setter("layers/7/offloaded_bytes", 1024)),
               ("layers[7].offloaded[0]: 'weight' is tied to 'embed.weight'", "a tied param is never offloaded")),
    _file_case("plan-offloaded-tie-target", "validate", "uva",
               edits(setter("layers/0/offloaded", ["weight"]), setter("layers/0/offloaded_bytes", 1024),
                     setter("layers/0/resident_bytes", 0)),
               ("layers[0].offloaded[0]: 'embed.weight' is offloaded but 'head.weight' share its storage",)),
    _file_case("plan-tied-unknown-target", "validate", "none", setter("layers/7/tied/weight", "embed.wieght"),
               ("layers[7].tied.weight: 'embed.wieght' is not a param of any layer of the plan",)),
    _file_case("plan-tied-shape-differs", "validate", "none",
               edits(setter("layers/7/params/weight/shape", [8, 64])),
               ("layers[7].params.weight: 'weight' is shape [8, 64], dtype float16 but its owner 'embed.weight' "
                "is shape [64, 8]",)),
    _file_case("plan-tied-to-itself", "validate", "none", setter("layers/7/tied/weight", "head.weight"),
               ("layers[7].tied.weight: 'head.weight' is the param itself",)),
    # -- identity -----------------------------------------------------------------------------
    _file_case("plan-sha-garbage", "validate", "none", setter("summary/spec_sha256", "not-a-hash"),
               ("summary.spec_sha256: 'not-a-hash' is not a sha256 (64 lowercase hex digits)",)),
    _file_case("plan-sha-uppercase", "diff", "uva",
               lambda d: d["summary"].update(spec_sha256=d["summary"]["spec_sha256"].upper()),
               ("summary.spec_sha256", "is not a sha256")),
    _file_case("plan-duplicate-layer-name", "validate", "none", setter("layers/4/name", "blocks.2"),
               ("layers[4].name: layer name 'blocks.2' is also the name of layers[3]",)),
]


# ---------------------------------------------------------------------------
# runtime.apply refuses a self-contradicting plan before anything moves


_MODELS: dict[str, tuple[Any, dict[str, Any]]] = {}  # tmp folder -> (model, its weights before the call)


@cache
def _runtime_plan_json() -> str:
    import planner
    import runtime
    from schemas.io import plan_data

    spec = runtime.describe(_tiny_model(), name="tiny-llama")
    return json.dumps(plan_data(planner.plan(spec, strategy="group", group_size=2, num_in_group=1,
                                             prefetch_step=2, backend="prefetch")))


def _tiny_model() -> Any:
    from models import LlamaConfig, make_llama

    return make_llama(LlamaConfig(vocab=64, dim=16, layers=4, heads=2, kv_heads=1, hidden=32))


def _model_for(d: Path) -> Any:
    model = _tiny_model()
    _MODELS[str(d)] = (model, {k: (v.detach().clone(), v.device, id(v))
                               for k, v in model.state_dict(keep_vars=True).items()})
    return model


def _unchanged(d: Path) -> None:
    import torch

    model, before = _MODELS.pop(str(d))
    now = model.state_dict(keep_vars=True)
    for k, (value, device, ident) in before.items():
        t = now[k]
        assert id(t) == ident and t.device == device and torch.equal(t.detach(), value), f"{k} was moved"
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules()), "hooks left behind"


def _apply_file(edit: Edit) -> Callable[[Path], object]:
    def call(d: Path) -> object:
        import runtime

        data = json.loads(_runtime_plan_json())
        edit(data)
        (d / "plan.yaml").write_text(dump_yaml(data))
        return runtime.apply(d / "plan.yaml", _model_for(d), device="cpu")
    return call


def _apply_object(edit: Edit) -> Callable[[Path], object]:
    """A Plan object built without validation (``model_construct``), as code that skips it might."""
    def call(d: Path) -> object:
        import runtime
        from schemas import Plan

        plan = Plan.model_validate(json.loads(_runtime_plan_json()))
        data = copy.deepcopy(plan.model_dump())
        edit(data)
        return runtime.apply(_construct(data), _model_for(d), device="cpu")
    return call


def _construct(data: dict[str, Any]) -> Any:
    from schemas import BufferKey, BufferPool, Plan, PlanLayer, PlanParam, Prefetch, Summary

    layers = [PlanLayer.model_construct(**{**layer, "params": {k: PlanParam.model_construct(**p)
                                                               for k, p in layer["params"].items()},
                                           "prefetch": layer["prefetch"] and Prefetch.model_construct(**layer["prefetch"])})
              for layer in data["layers"]]
    pool = data["buffer_pool"] and BufferPool.model_construct(
        **{**data["buffer_pool"], "keys": [BufferKey.model_construct(**k) for k in data["buffer_pool"]["keys"]]})
    return Plan.model_construct(plan_version=2, summary=Summary.model_construct(**data["summary"]),
                                layers=layers, buffer_pool=pool)


def _validate_in_python(edit: Edit) -> Callable[[Path], object]:
    def call(d: Path) -> object:
        from schemas import Plan

        data = json.loads(_runtime_plan_json())
        edit(data)
        return Plan.model_validate(data)
    return call


CASES += [
    ApiCase("apply-file-param-bytes-lie", _apply_file(setter("layers/1/params/mlp.up_proj.weight/bytes", 1)), InputError,
            ("plan.yaml:", "layers[1].params['mlp.up_proj.weight'].bytes: 1 in the file, 1024 from shape [32, 16]",),
            after=_unchanged),
    ApiCase("apply-file-copy-before-itself", _apply_file(setter("layers/2/prefetch/copy_before", "model.layers.1")),
            InputError, ("layers[2].prefetch.copy_before: 'model.layers.1' in the file, 'model.layers.2' from",),
            after=_unchanged),
    ApiCase("apply-file-backend-none-offloads", _apply_file(setter("summary/backend", "none")), InputError,
            ("summary.backend: 'none' keeps every param on the GPU",), after=_unchanged),
    ApiCase("apply-object-one-slot", _apply_object(setter("layers/4/prefetch/slot", 0)), InputError,
            ("the plan: layers[4].prefetch.slot: 0 in the file, 1 from",), after=_unchanged),
    ApiCase("apply-object-over-budget", _apply_object(setter("summary/gpu_budget_bytes", 1000)), InputError,
            ("summary.gpu_budget_bytes: 1000", "larger than the plan's GPU budget"), after=_unchanged),
    ApiCase("apply-object-pool-key-bytes", _apply_object(setter("buffer_pool/keys/0/bytes", 2)), InputError,
            ("buffer_pool.keys[0].bytes: 2 in the file",), after=_unchanged),
    ApiCase("apply-object-offloaded-twice",
            _apply_object(lambda d: d["layers"][2]["offloaded"].append(d["layers"][2]["offloaded"][0])),
            InputError, ("layers[2].offloaded[", "is listed more than once"), after=_unchanged),
    ApiCase("python-plan-wrong-total", _validate_in_python(setter("summary/total_bytes", 3)), ValidationError,
            ("the plan contradicts itself", "summary.total_bytes: 3 in the file",)),
    ApiCase("python-plan-bad-hash", _validate_in_python(setter("summary/spec_sha256", "abc")), ValidationError,
            ("summary.spec_sha256: 'abc' is not a sha256",)),
]
