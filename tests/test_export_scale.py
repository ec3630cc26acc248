"""`planner export --to vllm` stays linear-ish in the stack depth: the group-rule search gives the answer of
the plain search over every (G, K) (kept here as the oracle), and on a deep stack it runs segments_for a
handful of times instead of once per rule. No timing: the counts say it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.vllm import export as vllm_export
from planner.layers import group_rule
from planner.vllm.export import _find_group, segments_for
from planner.vllm.flags import VllmFlags
from planner.vllm.layout import VllmParam
from planner.vllm.select import StackLayer

NAMES = ("attn.qkv_proj.weight", "attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight",
         "mlp.experts.w13_weight", "mlp.experts.w2_weight")


def _oracle(view, off, step):
    """Every (G, K) in order, as the search did before it was made linear; None: no rule."""
    n = len(view)
    used = {i for i, layer in enumerate(view) if off[layer.name]}
    for g in range(1, n + 1):
        for k in range(1, g + 1):
            picks = group_rule(n, g, k)
            if not used <= set(picks):
                continue
            required = [p for i in picks for p in off[view[i].name]]
            forbidden = [p.name for i in picks for p in view[i].params if p.name not in off[view[i].name]]
            segs = segments_for(required, forbidden)
            if segs is not None:
                return VllmFlags(group_size=g, num_in_group=k, prefetch_step=step, offload_params=segs)
    return None


def _view(classes: list[tuple[str, ...]], picks: list[int]) -> list[StackLayer]:
    return [StackLayer(f"model.layers.{i}", tuple(VllmParam(name, (name,), 10) for name in classes[c]))
            for i, c in enumerate(picks)]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_search_matches_every_rule_tried_in_order(data) -> None:
    classes = data.draw(st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True).map(tuple),
                                 min_size=1, max_size=3))
    n = data.draw(st.integers(1, 14))
    picks = data.draw(st.lists(st.integers(0, len(classes) - 1), min_size=n, max_size=n))
    view = _view(classes, picks)
    off = {}
    if data.draw(st.booleans()):  # a plan some group rule made: its picks offload their first param
        g = data.draw(st.integers(1, n))
        chosen = set(group_rule(n, g, data.draw(st.integers(1, g))))
        off = {layer.name: {layer.params[0].name} if i in chosen else set() for i, layer in enumerate(view)}
    else:
        for layer in view:
            names = [p.name for p in layer.params]
            off[layer.name] = set(data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))))
    if not any(off.values()):
        off[view[-1].name] = {view[-1].params[0].name}
    found = _find_group(view, off, 2)
    want = _oracle(view, off, 2)
    assert (found if isinstance(found, VllmFlags) else None) == want


def test_a_deep_stack_runs_segments_for_a_few_times(monkeypatch) -> None:
    """3,000 layers offloading the MLP of every third one from layer 1000 on, the rest not: no group rule
    covers it, so every G is tried (the old search tried ~4.5 million rules, each building its picks)."""
    calls = []

    def counted(required, forbidden):
        calls.append(1)
        return segments_for(required, forbidden)

    monkeypatch.setattr(vllm_export, "segments_for", counted)
    n = 3000
    view = _view([NAMES[:4]], [0] * n)
    off = {layer.name: ({"mlp.gate_up_proj.weight"} if i >= 1000 and i % 3 == 0 else set())
           for i, layer in enumerate(view)}
    off["model.layers.1001"] = {"mlp.down_proj.weight"}
    found = _find_group(view, off, 2)
    assert not isinstance(found, VllmFlags) and found.part == "a budget spread"
    assert len(calls) <= 3  # one per distinct forbidden set


def test_show_prints_a_deep_plan_as_plain_lines(monkeypatch) -> None:
    """Above RICH_ROWS layers the per-layer table is plain text: rich lays out no row of it (its per-row
    cost made a 20,000-layer plan take 40 s); the lines still hold every layer's cells."""
    import io

    from rich.console import Console
    from rich.table import Table

    import planner
    from planner.cli import show
    from schemas.io import load_model
    from schemas.spec import SpecFile

    monkeypatch.setattr(show, "RICH_ROWS", 300)
    n = 301
    text = ("model:\n  name: deep\n  dtype: float16\n  layers:\n"
            f"    - name: blocks.{{i}}\n      repeat: {n}\n      params: {{mlp.w1: [32, 8], norm.weight: [8]}}\n"
            "memory: {workspace: 0, activations: 0}\n")  # a toy: its budget is about weights
    plan = planner.plan(load_model(SpecFile, "deep.yaml", text), gpu_budget=n * 400, backend="prefetch")
    rows = []
    monkeypatch.setattr(Table, "add_row", lambda self, *cells, **kw: rows.append(cells))
    out = io.StringIO()
    show.render_table(plan, Console(file=out, width=160))
    lines = out.getvalue().splitlines()
    assert len(rows) <= len(plan.predictions.workloads)  # only the predictions table is rich's
    assert "(a plain table: more than 300 layers)" in lines
    by_name = {line.split()[1]: line for line in lines if len(line.split()) > 1 and line.split()[1].startswith("blocks.")}
    assert list(by_name) == [layer.name for layer in plan.layers]
    offloaded = [layer for layer in plan.layers if layer.offloaded]
    assert offloaded and all(", ".join(layer.offloaded) in by_name[layer.name] for layer in offloaded)
