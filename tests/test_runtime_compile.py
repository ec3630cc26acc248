"""torch.compile while a plan is applied: code compiled for another instance of the same class
(without offload hooks) is never reused for the offloaded model."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
import runtime  # noqa: E402
from models import LlamaConfig, make_llama  # noqa: E402


def _max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("backend", ["prefetch", "uva"])
def test_a_compiled_unoffloaded_twin_does_not_leak_its_code(backend):
    import torch._dynamo.config as config

    before = config.skip_nnmodule_hook_guards
    base = make_llama(LlamaConfig(vocab=512, dim=64, layers=6, heads=4, kv_heads=2, hidden=128))
    twin = copy.deepcopy(base)
    ids = torch.randint(0, 500, (1, 8))
    with torch.no_grad():
        eager = twin(ids)
    plan = planner.plan(runtime.describe(base), strategy="group", group_size=3, num_in_group=2, backend=backend)
    with runtime.apply(plan, base, device="cpu"):
        assert config.skip_nnmodule_hook_guards is False
        with torch.no_grad():
            reference = torch.compile(twin, fullgraph=True)(ids)  # compiled first: its code has no hooks
            got = [torch.compile(base, fullgraph=True)(ids) for _ in range(2)]
    own = _max_diff(reference, eager)  # compile's own rounding
    for g in got:
        assert _max_diff(g, reference) <= max(own, 1e-3), (_max_diff(g, reference), own)
    assert config.skip_nnmodule_hook_guards == before  # the setting comes back with the last remove()


def test_hook_guards_stay_on_while_any_plan_is_applied():
    import torch._dynamo.config as config

    before = config.skip_nnmodule_hook_guards
    models = [make_llama(LlamaConfig(vocab=64, dim=32, layers=2, heads=2, kv_heads=1, hidden=64)) for _ in range(2)]
    handles = [runtime.apply(planner.plan(runtime.describe(m), strategy="group", group_size=1, num_in_group=1),
                             m, device="cpu") for m in models]
    handles[0].remove()
    assert config.skip_nnmodule_hook_guards is False
    handles[1].remove()
    handles[1].remove()  # idempotent: releases once
    assert config.skip_nnmodule_hook_guards == before
