"""Mixed plans (a backend per param): plan files whose ``uva`` lists contradict the rest, bad
``offload.backends`` / ``--backends``, assignments that cannot be assembled, and a contradicting mixed
plan handed to ``runtime.apply`` (refused before anything moves)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from corpus.case import ApiCase, CliCase
from corpus.plans import SPEC_TEXT, Edit, edits, setter, valid_plan_data
from schemas import InputError, SpecFile
from schemas.io import parse_text
from schemas.yaml_write import dump_yaml

# blocks.1, 2, 4, 5 offloaded (layers[2], [3], [5], [6]), attn.qkv on UVA, the MLP and norm prefetched in two slots
MIXED = {"strategy": "group", "group_size": 3, "num_in_group": 2, "prefetch_step": 1, "backend": "prefetch",
         "backends": {"attention": "uva"}}


@cache
def _mixed_json() -> str:
    import planner
    from schemas.io import plan_data

    spec = SpecFile.model_validate(parse_text(SPEC_TEXT, "spec"))
    return json.dumps(plan_data(planner.plan(spec, **MIXED)))


def mixed_plan_data() -> dict[str, Any]:
    return json.loads(_mixed_json())


def _plan_case(id: str, edit: Edit, expect: tuple[str, ...], base: str = "mixed", command: str = "validate") -> CliCase:
    def setup(d: Path) -> None:
        data = mixed_plan_data() if base == "mixed" else valid_plan_data(base)
        (d / "good.yaml").write_text(dump_yaml(data))
        edit(data)
        (d / "bad.yaml").write_text(dump_yaml(data))

    args = ("diff", "{d}/good.yaml", "{f}") if command == "diff" else (command, "{f}")
    return CliCase(id=f"mixed-{id}", args=args, setup=setup, exit=2, expect=("bad.yaml", *expect))


def _all_uva(i: int) -> Edit:
    return lambda d: d["layers"][i].update(uva=list(d["layers"][i]["offloaded"]))


def _pool_key_for_uva(d: dict[str, Any]) -> None:
    d["buffer_pool"]["keys"].insert(0, {"param": "attn.qkv", "shape": [24, 8], "dtype": "float16", "bytes": 384,
                                        "slots": [0, 1]})


def _spec(offload: str) -> dict[str, str]:
    return {"bad.yaml": SPEC_TEXT + "offload:\n" + offload}


def _plan_cli(id: str, *args: str, expect: tuple[str, ...], files: dict[str, str] | None = None) -> CliCase:
    return CliCase(id=f"mixed-{id}", args=("plan", "{f}", *args), files=files or {"bad.yaml": SPEC_TEXT},
                   exit=2, expect=expect)


GROUP_ARGS = ("--strategy", "group", "--group-size", "3", "--num-in-group", "2")


# -- assemble: an assignment that cannot apply to the spec ------------------------------------

def _assemble(where: dict) -> Any:
    from planner.assemble import assemble
    from planner.assemble import Assignment

    spec = SpecFile.model_validate(parse_text(SPEC_TEXT, "spec"))
    return assemble(spec.model.expanded(), Assignment(where, None, "budget", "test"), model_name="t",
                    spec_sha256="0" * 64)


def _assemble_case(id: str, where: dict, expect: tuple[str, ...]) -> ApiCase:
    from planner.errors import PlanningError

    return ApiCase(id=f"mixed-assemble-{id}", call=lambda _tmp: _assemble(where), error=PlanningError, expect=expect)


# -- runtime.apply: a contradicting mixed plan, the model untouched -----------------------------

_MODELS: dict[Path, tuple[Any, dict]] = {}


def _apply_edited(edit) -> Any:
    def call(tmp: Path) -> Any:
        import planner
        import runtime
        from model_state import snapshot
        from models import LlamaConfig, make_llama

        model = make_llama(LlamaConfig(vocab=64, dim=32, layers=4, heads=4, kv_heads=2, hidden=48))
        _MODELS[tmp] = (model, snapshot(model))
        plan = planner.plan(runtime.describe(model), strategy="group", group_size=2, num_in_group=1,
                            backend="prefetch", backends={"attention": "uva"})
        return runtime.apply(edit(plan), model, device="cpu")  # an edit skips validation
    return call


def _untouched(tmp: Path) -> None:
    from model_state import differences

    model, snap = _MODELS.pop(tmp)
    problems = differences(model, snap)
    assert not problems, "\n".join(problems)


def _uva_on_resident_layer(plan) -> Any:
    plan.layers[1].uva.append("mlp.up_proj.weight")  # in place: model.layers.0 offloads nothing
    return plan


def _backend_prefetch(plan) -> Any:
    return plan.model_copy(update={"summary": plan.summary.model_copy(update={"backend": "prefetch"})})


def _prefetch_all_uva(plan) -> Any:
    layer = next(layer for layer in plan.layers if layer.prefetch is not None)
    layer.uva[:] = list(layer.offloaded)
    return plan


CASES: list[CliCase | ApiCase] = [
    # -- plan files: the uva lists ---------------------------------------------------------------
    _plan_case("uva-not-offloaded", lambda d: d["layers"][4].update(uva=["mlp.w1"]),
               ("layers[4].uva[0]: 'mlp.w1' is not an offloaded param of this layer",)),
    _plan_case("uva-misspelled", setter("layers/2/uva/0", "attn.qvk"),
               ("layers[2].uva[0]: 'attn.qvk' is not an offloaded param", "did you mean 'attn.qkv'")),
    _plan_case("uva-twice", lambda d: d["layers"][3]["uva"].append("attn.qkv"),
               ("layers[3].uva[1]: 'attn.qkv' is listed more than once",)),
    _plan_case("uva-tied-param", lambda d: d["layers"][7].update(uva=["weight"]),
               ("layers[7].uva[0]: 'weight' is not an offloaded param",)),
    _plan_case("uva-a-string", setter("layers/2/uva", "attn.qkv"), ("layers[2].uva", "list"), command="show"),
    # -- the backend against the lists -------------------------------------------------------------
    _plan_case("called-prefetch", setter("summary/backend", "prefetch"),
               ("layers[2].uva: backend 'prefetch' copies every offloaded param, but [attn.qkv] is listed as on UVA",
                "'mixed'")),
    _plan_case("called-uva", setter("summary/backend", "uva"),
               ("layers[2].uva: backend 'uva' reads every offloaded param through UVA, but 'mlp.w1', 'mlp.w2', "
                "'norm.weight' are not listed here", "buffer_pool: backend 'uva' has no buffer pool")),
    _plan_case("uva-plan-without-uva-lists", lambda d: [layer.pop("uva", None) for layer in d["layers"]],
               ("layers[2].uva: backend 'uva' reads every offloaded param through UVA", "list them"), base="uva"),
    _plan_case("uva-plan-called-mixed", setter("summary/backend", "mixed"),
               ("summary.backend: 'mixed' prefetches some offloaded params", "every offloaded param is on UVA "
                "(use 'uva')"), base="uva"),
    _plan_case("prefetch-plan-called-mixed", setter("summary/backend", "mixed"),
               ("summary.backend", "no layer lists a param under uva (use 'prefetch')"), base="prefetch"),
    _plan_case("backend-typo", setter("summary/backend", "mixd"), ("summary.backend", "'mixed'")),
    # -- the pool and the schedule cover the prefetched params only ---------------------------------
    _plan_case("pool-key-for-a-uva-param", _pool_key_for_uva,
               ("buffer_pool.keys[0]: no offloaded param needs a buffer attn.qkv [24, 8] float16",)),
    _plan_case("prefetch-entry-on-all-uva-layer", _all_uva(5),
               ("layers[5].prefetch: a prefetch entry, but every offloaded param of the layer is on UVA",
                "over 3 offloaded layers"), command="show"),
    _plan_case("prefetch-entry-missing", setter("layers/3/prefetch", None),
               ("layers[3].prefetch: the layer prefetches params (offloaded, not on UVA) under the mixed backend",)),
    _plan_case("pool-bytes-count-uva", setter("buffer_pool/bytes", 2304),
               ("buffer_pool.bytes: 2304 in the file, 768 from",)),
    _plan_case("buffer-bytes-count-uva", edits(setter("summary/buffer_bytes", 2304), setter("summary/peak_gpu_bytes", 5632)),
               ("summary.buffer_bytes: 2304 in the file, 768 from",), command="diff"),
    _plan_case("offloaded-bytes-without-uva", setter("summary/offloaded_bytes", 3072),
               ("summary.offloaded_bytes: 3072 in the file, 4608 from",)),
    # -- offload.backends in a spec, --backends on the command line ----------------------------------
    _plan_cli("spec-backends-none", *GROUP_ARGS, files=_spec("  backends: {attention: none}\n"),
              expect=("bad.yaml:", "offload.backends.attention", "expected 'prefetch', 'uva' or 'cpu' (got 'none')")),
    _plan_cli("spec-backends-unknown-kind", *GROUP_ARGS, files=_spec("  backends:\n    routed_expert: uva\n"),
              expect=("bad.yaml:", "routed_expert", "did you mean 'routed_experts'")),
    _plan_cli("spec-backends-list", *GROUP_ARGS, files=_spec("  backends: [attention]\n"),
              expect=("bad.yaml:", "offload.backends")),
    _plan_cli("spec-backends-empty", *GROUP_ARGS, files=_spec("  backends: {}\n"),
              expect=("offload.backends", "backends is empty")),
    _plan_cli("spec-backends-with-backend-none", files=_spec("  backend: none\n  backends: {attention: uva}\n"),
              expect=("bad.yaml:", "backend 'none' offloads nothing")),
    _plan_cli("spec-backends-outside-kinds", *GROUP_ARGS,
              files=_spec("  kinds: [dense_mlp]\n  backends: {attention: uva}\n"),
              expect=("backends names attention, which kinds leaves out",)),
    _plan_cli("cli-backends-no-equals", *GROUP_ARGS, "--backends", "attention",
              expect=("--backends: 'attention' is not KIND=BACKEND",)),
    _plan_cli("cli-backends-empty-value", *GROUP_ARGS, "--backends", "attention=",
              expect=("--backends: 'attention=' is not KIND=BACKEND",)),
    _plan_cli("cli-backends-only-commas", *GROUP_ARGS, "--backends", ",,",
              expect=("--backends: no KIND=BACKEND given",)),
    _plan_cli("cli-backends-twice", *GROUP_ARGS, "--backends", "attention=uva,attention=prefetch",
              expect=("--backends: attention is given twice",)),
    _plan_cli("cli-backends-unknown-backend", *GROUP_ARGS, "--backends", "attention=uav",
              expect=("with the command-line options", "backends.attention", "(got 'uav')", "did you mean 'uva'")),
    _plan_cli("cli-backends-kind-typo", *GROUP_ARGS, "--backends", "atention=uva",
              expect=("backends.atention", "did you mean 'attention'")),
    _plan_cli("cli-backends-auto", *GROUP_ARGS, "--backends", "attention=auto",
              expect=("backends.attention", "expected 'prefetch', 'uva' or 'cpu' (got 'auto')")),
    _plan_cli("cli-backends-cpu-not-experts", *GROUP_ARGS, "--backends", "attention=cpu",
              expect=("backends: attention cpu: the cpu backend computes routed experts only",)),
    _plan_cli("cli-backends-with-backend-none", "--backend", "none", "--backends", "attention=uva",
              expect=("backend 'none' offloads nothing",)),
    # -- assemble ------------------------------------------------------------------------------
    _assemble_case("tied-param", {"head": {"weight": "uva"}}, ("head.weight is tied to embed.weight",)),
    _assemble_case("tie-target", {"embed": {"weight": "prefetch"}}, ("embed.weight has params tied to it",)),
    _assemble_case("unknown-layer", {"blocks.6": {"mlp.w1": "uva"}}, ("layer 'blocks.6' is not in the spec",)),
    _assemble_case("unknown-param", {"blocks.1": {"mlp.w3": "prefetch"}}, ("blocks.1.mlp.w3 is not a param",)),
    _assemble_case("unknown-backend", {"blocks.1": {"mlp.w1": "none"}}, ("backend 'none'", "prefetch or uva")),
    # -- runtime.apply ----------------------------------------------------------------------------
    ApiCase("mixed-runtime-uva-on-resident-layer", _apply_edited(_uva_on_resident_layer), InputError,
            ("layers[1].uva[0]", "'mlp.up_proj.weight' is not an offloaded param"), _untouched),
    ApiCase("mixed-runtime-called-prefetch", _apply_edited(_backend_prefetch), InputError,
            ("backend 'prefetch' copies every offloaded param",), _untouched),
    ApiCase("mixed-runtime-prefetch-entry-on-all-uva-layer", _apply_edited(_prefetch_all_uva), InputError,
            ("every offloaded param of the layer is on UVA",), _untouched),
]
