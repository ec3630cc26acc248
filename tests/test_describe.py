"""runtime.describe: layers in order, params and buffers, strides, ties, folding; and a
transformers model with tied embeddings described, planned, applied and removed on CPU."""

from __future__ import annotations

import copy
import logging

import pytest

from schemas.spec_build import LayerEntry, build_spec
from schemas.spec_dump import compact_spec, dump_spec
from schemas.io import load_model
from schemas.spec import SpecFile

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402


def tightest_plan(spec: SpecFile, backend: str):
    """The plan at the smallest feasible GPU budget (the most offloaded)."""
    with pytest.raises(InfeasibleError) as err:
        planner.plan(spec, gpu_budget=1, backend=backend)
    return planner.plan(spec, gpu_budget=err.value.min_gpu_budget, backend=backend)


class Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(4), persistent=False)


class Block(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.attn = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim, bias=False), nn.Linear(2 * dim, dim, bias=False))
        self.register_buffer("scale", torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.attn(x)) * self.scale


class Net(nn.Module):
    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.rotary = Rotary()
        self.layers = nn.ModuleList(Block() for _ in range(blocks))
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 10, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))


def test_layers_params_buffers_and_folding() -> None:
    spec = runtime.describe(Net())
    assert spec.model.name == "Net" and spec.model.dtype == "float32"
    assert [layer.name for layer in spec.model.layers] == ["embed", "layers.{i}", "norm", "head"]
    block = spec.model.layers[1]
    assert block.repeat == 4
    assert list(block.params) == list(Block().state_dict())  # state_dict order: own tensors first
    assert list(block.params) == ["scale", "attn.weight", "attn.bias", "mlp.0.weight", "mlp.1.weight"]
    assert block.params["scale"].buffer and not block.params["attn.weight"].buffer
    assert block.params["mlp.0.weight"].shape == [16, 8]
    names = [layer.name for layer in spec.model.expanded()]
    assert names == ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "head"]


def test_non_persistent_buffers_only_on_request() -> None:
    net = Net(2)
    assert "rotary" not in [layer.name for layer in runtime.describe(net).model.layers]
    spec = runtime.describe(net, non_persistent=True)
    rotary = next(layer for layer in spec.model.layers if layer.name == "rotary")
    assert rotary.params["inv_freq"].buffer


def test_unfolded_when_blocks_differ_and_fold_off() -> None:
    net = Net(3)
    net.layers[2].attn = nn.Linear(8, 8, bias=False)
    spec = runtime.describe(net)
    assert [(layer.name, layer.repeat) for layer in spec.model.layers] == [
        ("embed", None), ("layers.{i}", 2), ("layers.2", None), ("norm", None), ("head", None)]
    assert [layer.name for layer in runtime.describe(Net(2), fold=False).model.layers] == \
        ["embed", "layers.0", "layers.1", "norm", "head"]


def test_dtypes_and_non_contiguous_strides() -> None:
    net = Net(2).to(torch.bfloat16)
    net.layers[0].scale = net.layers[0].scale.float()
    w = net.head.weight
    net.head.weight = nn.Parameter(w.detach().t().contiguous().t())  # same shape, column-major
    spec = runtime.describe(net, name="n")
    layers = {layer.name: layer for layer in spec.model.expanded()}
    assert spec.model.dtype == "bfloat16"
    assert layers["layers.0"].params[0].dtype == "float32" and layers["layers.1"].params[0].dtype == "bfloat16"
    head = layers["head"].params[0]
    assert head.stride == (1, 10) and head.nbytes == 160


def test_ties_from_identity_shared_storage_and_meta() -> None:
    net = Net(2)
    net.head.weight = net.embed.weight  # not the same shape as a Linear(8, 10)? it is: [10, 8]
    spec = runtime.describe(net)
    ties = [(layer.name, rel, owner) for layer in spec.model.expanded() for rel, owner in layer.tied.items()]
    assert ties == [("head", "weight", "embed.weight")]

    net = Net(2)
    net.head.weight = nn.Parameter(net.embed.weight.data)  # another object, the same memory and view
    ties = [(layer.name, owner) for layer in runtime.describe(net).model.expanded() for owner in layer.tied.values()]
    assert ties == [("head", "embed.weight")]

    net = Net(2)
    net.head.weight = nn.Parameter(net.embed.weight.data.view(8, 10))  # same memory, another view: a tie too
    ties = [(layer.name, owner) for layer in runtime.describe(net).model.expanded() for owner in layer.tied.values()]
    assert ties == [("head", "embed.weight")]

    with torch.device("meta"):
        net = Net(2)
    net.head.weight = net.embed.weight
    ties = [(layer.name, owner) for layer in runtime.describe(net).model.expanded() for owner in layer.tied.values()]
    assert ties == [("head", "embed.weight")]
    with torch.device("meta"):
        twins = Net(2)  # meta tensors all report address 0: identity only, so no false ties
    assert not any(layer.tied for layer in runtime.describe(twins).model.expanded())


def test_ties_inside_blocks_fold_into_the_template() -> None:
    net = Net(3)
    for block in net.layers:
        block.mlp[1].weight = nn.Parameter(block.mlp[0].weight.data.t())  # a transposed view: tied by storage
        block.attn2 = block.attn  # the same module under a second name
    spec = runtime.describe(net)
    block = spec.model.layers[1]
    assert block.repeat == 3
    assert block.tied == {"mlp.1.weight": "layers.{i}.mlp.0.weight", "attn2.weight": "layers.{i}.attn.weight",
                          "attn2.bias": "layers.{i}.attn.bias"}
    assert "mlp.1.weight" not in block.params
    expanded = {layer.name: layer.tied for layer in spec.model.expanded()}
    assert expanded["layers.2"]["attn2.weight"] == "layers.2.attn.weight"


def test_root_tensors_are_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    net = Net(2)
    net.temperature = nn.Parameter(torch.ones(1))
    with caplog.at_level(logging.WARNING, logger="runtime"):
        spec = runtime.describe(net)
    assert "temperature" in caplog.text
    assert "temperature" not in dump_spec(spec)
    # the warning says what apply does: it refuses the model unless unplanned='move' (never "still moves")
    assert "runtime.apply refuses" in caplog.text and "unplanned='move'" in caplog.text
    assert "still moves" not in caplog.text
    plan = planner.plan(spec, backend="none")
    with pytest.raises(Exception, match="temperature"):
        runtime.apply(plan, net, device="cpu")
    with runtime.apply(plan, net, device="cpu", unplanned="move"):
        pass


def test_nothing_to_describe() -> None:
    with pytest.raises(ValueError, match="no parameters or buffers"):
        runtime.describe(nn.ReLU())


def test_compact_dump_round_trips() -> None:
    spec = runtime.describe(Net(2), non_persistent=True)
    text = dump_spec(spec, header="made in a test\nsecond line")
    assert text.startswith("# made in a test\n# second line\nmodel:\n")
    assert load_model(SpecFile, "t", text) == spec
    assert "buffer: false" not in text and "repeat" in text and "dtype: float32\n  layers" in text
    data = compact_spec(spec)
    assert data["model"]["layers"][0]["params"] == {"weight": [10, 8]}
    assert "memory" not in data and "offload" not in data
    assert load_model(SpecFile, "t", dump_spec(spec, "json")) == spec


def test_build_spec_default_dtype_is_the_most_elements() -> None:
    entries = [LayerEntry("a", {"w": {"shape": [100], "dtype": "int8"}}),
               LayerEntry("b", {"w": {"shape": [10], "dtype": "float32"}})]
    spec = build_spec("x", entries)
    assert spec.model.dtype == "int8" and spec.model.layers[1].params["w"].dtype == "float32"
    assert build_spec("x", entries, dtype="float32").model.layers[0].params["w"].dtype == "int8"


def test_described_net_plans_applies_and_removes_on_cpu() -> None:
    torch.manual_seed(0)
    net = Net(6)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_()
    ids = torch.randint(0, 10, (2, 3))
    want = net(ids)
    spec = runtime.describe(net)
    before = {k: (v.detach().clone(), id(v)) for k, v in net.state_dict(keep_vars=True).items()}
    plan = tightest_plan(spec, "prefetch")
    assert any("scale" in layer.offloaded for layer in plan.layers)  # buffers move too
    with pytest.raises(runtime.PlanMismatchError, match="registered buffers"):
        runtime.apply(plan, net, device="cpu")  # only when the caller vouches that the model never writes them
    with runtime.apply(plan, net, device="cpu", read_only_buffers=True):
        assert torch.equal(net(ids), want)
    for k, v in net.state_dict(keep_vars=True).items():
        assert torch.equal(v.detach(), before[k][0]) and id(v) == before[k][1], k


# ---------------------------------------------------------------------------
# transformers


def tiny_llama(tied: bool):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_transformers_tied_embeddings_one_pair_apply_remove() -> None:
    model = tiny_llama(tied=True)
    spec = runtime.describe(model, name="tiny")
    ties = [(layer.name, rel, owner) for layer in spec.model.expanded() for rel, owner in layer.tied.items()]
    assert ties == [("lm_head", "weight", "model.embed_tokens.weight")]
    assert [layer.name for layer in spec.model.layers] == ["model.embed_tokens", "model.layers.{i}",
                                                           "model.norm", "lm_head"]
    ids = torch.randint(0, 128, (1, 7))
    with torch.no_grad():
        want = model(ids).logits
    snap = {k: (v.detach().clone(), id(v), v.stride()) for k, v in model.state_dict(keep_vars=True).items()}
    for backend in ("prefetch", "uva"):
        plan = tightest_plan(spec, backend)
        assert sum(bool(layer.offloaded) for layer in plan.layers) >= 2
        with runtime.apply(plan, model, device="cpu"):
            assert model.lm_head.weight is model.model.embed_tokens.weight
            with torch.no_grad():
                assert torch.equal(model(ids).logits, want)
        now = model.state_dict(keep_vars=True)
        for k, (value, ident, stride) in snap.items():
            assert id(now[k]) == ident and now[k].stride() == stride and torch.equal(now[k].detach(), value), k
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_transformers_meta_model_is_described_like_the_real_one() -> None:
    transformers = pytest.importorskip("transformers")
    real = tiny_llama(tied=False)
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(copy.deepcopy(real.config))
    assert runtime.describe(meta) == runtime.describe(real)
    assert not any(layer.tied for layer in runtime.describe(meta).model.expanded())
