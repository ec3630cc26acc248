"""Measured routing (schemas/routing.py): the file round-trips, plans made with it keep the most used experts on
the GPU and say so, and a spec the statistics do not match is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from cli_samples import invoke

import planner
from schemas.errors import InputError
from schemas.io import dump_model, load_routing
from schemas.routing import LayerRouting, RoutingRef, RoutingStats
from test_plan_experts import E, moe_spec


@st.composite
def layer_routing(draw, name="model.layers.0"):
    experts = draw(st.integers(1, 12))
    top_k = draw(st.integers(1, experts))
    tokens = draw(st.integers(0, 50))
    counts = [0] * experts
    for _ in range(tokens):
        for e in draw(st.permutations(range(experts)))[:top_k]:
            counts[e] += 1
    return LayerRouting(layer=name, experts=experts, top_k=top_k, tokens=tokens, counts=counts)


@settings(max_examples=25, deadline=None)
@given(layer_routing(), st.sampled_from(["yaml", "json"]))
def test_routing_files_round_trip(tmp_path_factory, layer, fmt):
    stats = RoutingStats(model="m", source="test", layers=[layer])
    path = tmp_path_factory.mktemp("r") / f"r.{fmt}"
    path.write_text(dump_model(stats, fmt))
    loaded, sha = load_routing(path)
    assert loaded == stats and len(sha) == 64
    assert abs(sum(loaded.layers[0].shares()) - (layer.top_k if layer.tokens else layer.top_k)) < 1e-9


@pytest.mark.parametrize("edit, message", [
    ({"counts": [1, 2]}, "counts lists 2 experts, the layer has 3"),
    ({"counts": [1, 1, 1]}, "counts add up to 3, but 2 tokens each routed to 2 experts make 4"),
    ({"top_k": 4}, "top_k (4) is larger than experts (3)"),
    ({"tokens": -1}, "greater than or equal to 0"),
])
def test_inconsistent_layers_are_refused(edit, message):
    data = {"layer": "model.layers.0", "experts": 3, "top_k": 2, "tokens": 2, "counts": [2, 1, 1]} | edit
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LayerRouting.model_validate(data)


def skewed(layers: int = 2, hot: tuple[int, ...] = (5, 6)) -> RoutingStats:
    """Experts ``hot`` take most tokens (top-2 of 8: each token picks one hot expert and one other)."""
    out = []
    for i in range(layers):
        counts = [1] * E
        for e in hot:
            counts[e] += 49
        # 100 tokens x 2 choices = 200: the hot two get 100, the other six 100 between them
        counts = [c if e in hot else 0 for e, c in enumerate(counts)]
        rest = [e for e in range(E) if e not in hot]
        for j in range(100):
            counts[rest[j % len(rest)]] += 1
        out.append(LayerRouting(layer=f"model.layers.{i}", experts=E, top_k=2, tokens=100, counts=counts))
    return RoutingStats(model="toy-moe", source="test", layers=out)


def test_a_plan_with_routing_keeps_the_most_used_experts_and_names_the_file():
    spec = moe_spec()
    ref = RoutingRef(file="routing.yaml", sha256="a" * 64)
    per_expert = (32 * 16 + 16 * 16) * 2
    plain = planner.plan(spec, strategy="budget", backend="uva", gpu_budget=10_000)
    hot = planner.plan(spec, strategy="budget", backend="uva", gpu_budget=10_000, routing=skewed(), routing_ref=ref)
    assert hot.summary.routing == ref and plain.summary.routing is None
    splits = [layer.experts for layer in hot.layers if layer.experts is not None]
    assert len(splits) == 2
    assert all({5, 6} <= set(s.gpu) and len(s.gpu) < E for s in splits)  # the hot experts first, in both layers
    assert hot.summary.peak_gpu_bytes <= 10_000
    assert 10_000 - hot.summary.peak_gpu_bytes < per_expert  # no expert more would fit
    assert any(note.startswith("routing: then the experts of 2 MoE layers are split") for note in hot.summary.notes)
    assert hot.predictions is not None


def test_a_spec_that_does_not_match_the_routing_is_refused():
    stats = skewed(layers=3)
    with pytest.raises(InputError, match="model.layers.2, which the spec has no MoE layer of"):
        planner.plan(moe_spec(2), gpu_budget=20_000, routing=stats, routing_ref=RoutingRef(file="r.yaml", sha256="b" * 64))
    wrong = skewed().model_copy(deep=True)
    wrong.layers[0] = LayerRouting(layer="model.layers.0", experts=4, top_k=2, tokens=1, counts=[1, 1, 0, 0])
    with pytest.raises(InputError, match="r.yaml does not match the spec toy-moe.*the spec has 8 experts, top-2; the "
                                         "file recorded 4 experts, top-2"):
        planner.plan(moe_spec(2), gpu_budget=20_000, routing=wrong, routing_ref=RoutingRef(file="r.yaml", sha256="b" * 64))


def test_plan_routing_on_the_command_line(tmp_path):
    spec = tmp_path / "moe.yaml"
    spec.write_text(dump_model(moe_spec()))
    routing = tmp_path / "routing.yaml"
    routing.write_text(dump_model(skewed()))
    out = tmp_path / "p.plan.yaml"
    result = invoke("plan", str(spec), "-g", "20000", "--strategy", "budget", "--backend", "uva", "--routing", str(routing),
                    "-o", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert f"file: {routing}" in text and "sha256: " in text
    check = invoke("plan", str(spec), "-g", "20000", "--strategy", "budget", "--backend", "uva", "--routing", str(routing),
                   "--check", str(out))
    assert check.exit_code == 0, check.output
    routing.write_text(dump_model(skewed(layers=3)))
    bad = invoke("plan", str(spec), "-g", "20000", "--routing", str(routing))
    assert bad.exit_code == 2 and "which the spec has no MoE layer of" in bad.output
    routing.write_text("routing_version: 1\nmodel: m\nlayers: []\n")
    bad = invoke("plan", str(spec), "-g", "20000", "--routing", str(routing))
    assert bad.exit_code == 2 and "layers" in bad.output and "Traceback" not in bad.output
    bad = invoke("plan", str(spec), "-g", "20000", "--routing", str(spec))
    assert bad.exit_code == 2 and "this is a spec file, not a routing statistics" in bad.output


def test_a_routing_of_too_few_tokens_is_named_in_the_plan():
    """A recording that gave each expert fewer than 16 choices on average does not estimate their chances (one
    32-token step of 128 experts at top-8 gives 2): the plan says so, naming the file and the layers; the skewed
    recording above (100 tokens, top-2 of 8: 25 an expert) gets no such note."""
    ref = RoutingRef(file="one-step.yaml", sha256="c" * 64)
    few = RoutingStats(model="toy-moe", layers=[
        LayerRouting(layer=f"model.layers.{i}", experts=E, top_k=2, tokens=3, counts=[2, 1, 1, 0, 0, 1, 1, 0])
        for i in range(2)])
    assert [layer.choices_per_expert for layer in few.layers] == [0.75, 0.75]
    plan = planner.plan(moe_spec(), strategy="budget", backend="uva", gpu_budget=10_000, routing=few, routing_ref=ref)
    thin = [n for n in plan.summary.notes if "choices an expert" in n]
    assert len(thin) == 1 and "one-step.yaml" in thin[0] and "model.layers.{0,1}" in thin[0] and "0.8" in thin[0]
    hot = planner.plan(moe_spec(), strategy="budget", backend="uva", gpu_budget=10_000, routing=skewed(),
                       routing_ref=ref)
    assert not any("choices an expert" in n for n in hot.summary.notes)
    unseen = RoutingStats(model="toy-moe", layers=[LayerRouting(layer="model.layers.0", experts=E, top_k=2, tokens=0,
                                                                counts=[0] * E)])
    assert unseen.thin() == []  # no token seen: read as uniform routing, not as a sample
