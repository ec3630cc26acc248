"""Tensor-parallel runtime on the CPU: two gloo processes, a tiny Llama sharded with DTensor.

Each rank applies its rank plan to its shards and must compute exactly what the unoffloaded
tensor-parallel model computes; ``remove()`` must hand back the same param and local-shard objects
with the same values; plans for another rank, another world size or the whole model are refused and
leave the model as it was. The two ranks run this file as a script (``worker``) and write what each
check found; the tests below read it. Single-process tests cover what needs no process group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
WORLD = 2
TIMEOUT_S = 90


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


# ---------------------------------------------------------------------------------------------
# the worker: one process per rank


def worker(rank: int, store: str, out: Path) -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    import planner
    import runtime
    from models import LlamaConfig, make_llama
    from runtime.dtensor import local_tensor
    from runtime.errors import PlanMismatchError
    from schemas import Plan, dump_model
    from schemas.errors import InputError
    from hand_plans import span_plan
    from tp_model import parallelize, rank_plans

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (WORLD,))
    cfg = LlamaConfig(vocab=96, dim=32, layers=4, heads=4, kv_heads=2, hidden=48)
    ids = torch.randint(0, cfg.vocab, (2, 5), generator=torch.Generator().manual_seed(7))
    reference = parallelize(make_llama(cfg), mesh)
    model = parallelize(make_llama(cfg), mesh)
    with torch.no_grad():
        want = reference(ids)
    results: dict[str, str] = {}

    def check(name, fn):
        try:
            fn()
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - reported to the test in the parent
            results[name] = traceback.format_exc()

    def state():
        """Every param object, its local tensor object, values, layout; the hooks of every module."""
        out_ = {}
        for n, p in model.named_parameters():
            local = p._local_tensor if isinstance(p, DTensor) else p
            out_[n] = (p, local, local.detach().clone(), local.device, local.stride(),
                       getattr(p, "placements", None))
        hooks = {n: (len(m._forward_pre_hooks), len(m._forward_hooks), sorted(m.__dict__))
                 for n, m in model.named_modules()}
        return out_, hooks

    def same_state(before):
        (now, hooks), (then, then_hooks) = state(), before
        assert now.keys() == then.keys()
        for n, (p, local, value, device, stride, placements) in then.items():
            q, qlocal, _, _, _, qplacements = now[n]
            assert q is p and qlocal is local, f"{n}: not the same param / local tensor object"
            assert local.device == device and local.stride() == stride, n
            assert torch.equal(local, value), f"{n}: values changed"
            assert qplacements == placements, n
        assert hooks == then_hooks, "hooks or module attributes differ"
        ptrs = [local.data_ptr() for _, local, *_ in now.values()]
        assert len(set(ptrs)) == len(ptrs), "params share storage (a slot buffer left behind?)"

    def forward_equal():
        with torch.no_grad():
            got = model(ids)
        assert torch.equal(got, want), f"rank {rank}: max diff {(got.float() - want.float()).abs().max()}"

    spec = runtime.describe(model, name="tiny-tp")

    def describes_global_shapes_and_shards():
        layers = {layer.name: layer for layer in spec.model.layers}
        emb = layers["model.embed_tokens"].params["weight"]
        assert emb.shape == [cfg.vocab, cfg.dim] and emb.shard == "vocab"
        assert layers["lm_head"].params["weight"].shard == "vocab"
        block = next(layer for name, layer in layers.items() if name.startswith("model.layers"))
        assert block.params["self_attn.q_proj.weight"].shape == [cfg.dim, cfg.dim]
        assert block.params["self_attn.q_proj.weight"].shard == "dim0"
        assert block.params["mlp.down_proj.weight"].shard == "dim1"
        assert block.params["input_layernorm.weight"].shard == "replicated"
        local = runtime.describe(model, local=True)
        lblock = next(layer for layer in local.model.layers if layer.name.startswith("model.layers"))
        assert lblock.params["mlp.down_proj.weight"].shape == [cfg.dim, cfg.hidden // WORLD]
        assert lblock.params["mlp.down_proj.weight"].shard is None

    check("describe", describes_global_shapes_and_shards)

    def runs(backend, **kw):
        def run():
            plans = rank_plans(spec, WORLD, strategy="group", group_size=2, num_in_group=1, backend=backend, **kw)
            assert plans[rank].summary.offloaded_bytes > 0 and plans[rank].summary.rank == rank
            before = state()
            with runtime.apply(plans, model, device="cpu") as handle:
                for layer in plans[rank].layers:  # each offloaded local shard reads its slot buffer or host copy
                    for rel in layer.offloaded:
                        param = model.get_parameter(f"{layer.name}.{rel}")
                        reads = (handle._placement.entries[id(param)].host if backend == "uva" else
                                 handle.offloader.pool.buffer(rel, layer.params[rel], layer.prefetch.slot))
                        assert local_tensor(param).data_ptr() == reads.data_ptr(), f"{layer.name}.{rel}"
                for _ in range(3):  # the wrap-around: later forwards use what the previous one prefetched
                    forward_equal()
                sd = model.state_dict()  # true values while applied, as DTensors
                for n, (p, _, value, *_rest) in before[0].items():
                    got = sd[n]
                    assert isinstance(got, DTensor) == isinstance(p, DTensor), n
                    assert torch.equal(got._local_tensor if isinstance(got, DTensor) else got, value), n
                assert handle.plan.summary.rank == rank
            same_state(before)
            forward_equal()
        return run

    def spans():
        # every block prefetched on two slots and the (vocab-split) LM head spanning them, by hand
        plans = rank_plans(spec, WORLD, make=lambda part: span_plan(part, range(cfg.layers), 2, ("lm_head",)))
        head = next(layer for layer in plans[rank].layers if layer.name == "lm_head")
        assert head.prefetch.span and head.params["weight"].shard == "vocab"
        before = state()
        with runtime.apply(plans, model, device="cpu", stats=True) as handle:
            arena = handle.offloader.pool.arena
            assert local_tensor(model.get_parameter("lm_head.weight")).data_ptr() == arena.data_ptr()
            for _ in range(3):
                forward_equal()
            assert all(f["late_copies"] == 0 for f in handle.stats()["forwards"])
        same_state(before)
        forward_equal()

    check("prefetch_span", spans)
    check("prefetch", runs("prefetch", prefetch_step=2))
    check("prefetch_one_slot", runs("prefetch", prefetch_step=1))
    check("uva", runs("uva"))

    plans = rank_plans(spec, WORLD, strategy="group", group_size=2, num_in_group=1, backend="prefetch")

    def from_directory():
        folder = out / "plans"
        folder.mkdir(exist_ok=True)
        (folder / f"rank{rank}.plan.yaml").write_text(dump_model(plans[rank]))
        dist.barrier()
        before = state()
        with runtime.apply(folder, model, device="cpu"):
            forward_equal()
        same_state(before)

    check("directory", from_directory)

    def refused(call, error, *fragments):
        def run():
            before = state()
            with pytest.raises(error) as info:
                call()
            for f in fragments:
                assert f in str(info.value), f"{f!r} not in: {info.value}"
            same_state(before)
            forward_equal()
        return run

    other = plans[1 - rank]
    check("other_rank", refused(lambda: runtime.apply(other, model, device="cpu"), PlanMismatchError,
                                f"the plan for rank {1 - rank} of 2 cannot run on rank {rank}", f"rank{rank}.plan.yaml"))
    check("rank_argument", refused(lambda: runtime.apply(plans[rank], model, device="cpu", rank=1 - rank),
                                   PlanMismatchError, "cannot run on rank", "rank= argument"))
    def edited(plan, change):
        data = plan.model_dump()
        change(data)
        return Plan.model_validate(data)

    wrong_world = edited(plans[rank], lambda d: d["summary"].update(world_size=4))
    check("world_size", refused(lambda: runtime.apply(wrong_world, model, device="cpu"), PlanMismatchError,
                                "was made for 4 ranks", "DTensor over 2 ranks but the plan for rank"))
    single = planner.plan(spec, strategy="group", group_size=2, num_in_group=1, backend="prefetch")
    check("plain_plan", refused(lambda: runtime.apply(single, model, device="cpu"), PlanMismatchError,
                                "q_proj.weight': shape", "a plan for the whole model cannot run on one rank's shard",
                                "planner plan --tp 2"))
    check("list_of_one", refused(lambda: runtime.apply(plans[:1], model, device="cpu"), PlanMismatchError,
                                 "plans[0]: summary.world_size is 2, but the set has 1 rank plans"))
    check("list_swapped", refused(lambda: runtime.apply(plans[::-1], model, device="cpu"), PlanMismatchError,
                                  "plans[0]: summary.rank is 1, but it is in rank 0's place"))
    swapped = edited(plans[rank], lambda d: d["layers"][1]["params"]["self_attn.q_proj.weight"].update(shard="dim1"))
    check("shard", refused(lambda: runtime.apply(swapped, model, device="cpu"), PlanMismatchError,
                           "q_proj.weight' is split on dim 0 in the model", "says shard 'dim1'"))
    check("missing_rank_file", refused(lambda: runtime.apply(out / "empty", model, device="cpu"), InputError,
                                       "no rank plans (rank0.plan.yaml"))
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    # leave without tearing gloo down: its teardown now and then aborts the process ("terminate called
    # without an active exception") after all the work is done; both ranks have passed the barrier
    sys.stdout.flush()
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# the tests


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict[str, str]]:
    if not _dist_ready():
        pytest.skip("torch.distributed with gloo is not available")
    pytest.importorskip("torch.distributed.tensor.parallel")
    out = tmp_path_factory.mktemp("tp")
    (out / "empty").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(out / "store"), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"the {WORLD} ranks did not finish within {TIMEOUT_S} s (a hang in a collective?)")
    results = []
    for r, (p, log) in enumerate(zip(procs, logs)):
        file = out / f"rank{r}.json"
        assert p.returncode == 0 and file.exists(), f"rank {r} failed (exit {p.returncode}):\n{log[-4000:]}"
        results.append(json.loads(file.read_text()))
    return results


CHECKS = ["describe", "prefetch_span", "prefetch", "prefetch_one_slot", "uva", "directory", "other_rank", "rank_argument",
          "world_size", "plain_plan", "list_of_one", "list_swapped", "shard", "missing_rank_file"]


@pytest.mark.parametrize("name", CHECKS)
def test_each_rank(ranks, name):
    for r, results in enumerate(ranks):
        assert results.get(name) == "ok", f"rank {r}, {name}:\n{results.get(name, 'did not run')}"


def test_rank_argument_without_a_process_group():
    """A plain model is replicated on every rank: rank= picks this rank's plan from a list, no
    process group needed, and the outputs are exact."""
    import runtime
    from models import LlamaConfig, make_llama
    from tp_model import rank_plans, replicated

    model = make_llama(LlamaConfig(vocab=64, dim=32, layers=3, heads=4, kv_heads=2, hidden=48))
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids)
    plans = rank_plans(replicated(runtime.describe(model)), WORLD, strategy="group", group_size=2, num_in_group=1,
                       backend="prefetch")
    assert {p.shard for p in plans[1].layers[1].params.values()} == {"replicated"}
    for r in range(WORLD):
        with runtime.apply(plans, model, device="cpu", rank=r) as handle, torch.no_grad():
            assert handle.plan.summary.rank == r
            assert torch.equal(model(ids), want)


if __name__ == "__main__":
    sys.path[:0] = [str(HERE.parent), str(HERE)]
    worker(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
