"""The one-sort pass over a layer's GPU parts (runtime.expert_math.parts_rows) gives each row what the part-by-part
pass (part_rows, one sort a part) gives it, on the CPU: bit for bit, except the rows of a later part's first expert,
whose group in the grouped matmul also holds the earlier parts' rows (torch's CPU kernel then rounds a float32 row
differently: found by this test); those within float rounding. On the GPU the same rows are compared with the
resident model bit for bit (tests/test_cpu_experts_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402
from moe_models import ARCHITECTURES, make_moe  # noqa: E402
from torch import nn  # noqa: E402

from runtime.expert_math import Layout, part_rows, parts_rows  # noqa: E402


class BiasedExperts(nn.Module):
    """An experts module with biases and [E, in, out] weights (as gpt-oss's), transformers' forward signature."""

    has_gate, has_bias, is_transposed = True, True, True

    def __init__(self, experts: int = 12, hidden: int = 32, inter: int = 24) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(4)
        self.gate_up_proj = nn.Parameter(torch.randn(experts, hidden, 2 * inter, generator=g))
        self.gate_up_proj_bias = nn.Parameter(torch.randn(experts, 2 * inter, generator=g))
        self.down_proj = nn.Parameter(torch.randn(experts, inter, hidden, generator=g))
        self.down_proj_bias = nn.Parameter(torch.randn(experts, hidden, generator=g))

    def _apply_gate(self, a):
        gate, up = a.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward(self, hidden_states, top_k_index, top_k_weights):
        raise NotImplementedError


def _experts(arch: str):
    if arch == "biased":
        return BiasedExperts()
    model = make_moe(arch, implementation="grouped_mm")
    return next(m for name, m in model.named_modules() if name.endswith("experts"))


def _table(places: list[int], experts: int) -> torch.Tensor:
    """[E]: the ``table`` of ``part_rows`` for a part holding ``places`` in that order (each one's place in it, the
    other experts ``len(places)``)."""
    table = torch.full((experts,), len(places), dtype=torch.long)
    table[torch.tensor(places, dtype=torch.long)] = torch.arange(len(places))
    return table


@pytest.mark.parametrize("arch", (*ARCHITECTURES, "biased"))
@pytest.mark.parametrize("tokens", [1, 5, 40])
@pytest.mark.parametrize("host", [False, True])
def test_one_sort_gives_each_row_what_a_sort_a_part_gives(arch, tokens, host):
    module = _experts(arch)
    layout = Layout.of(module)
    w = {n: getattr(module, n).data for n in layout.names}
    experts = w[layout.up].shape[0]
    dtype = w[layout.up].dtype
    g = torch.Generator().manual_seed(tokens)
    k = min(4, experts)
    index = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=g).to(dtype)
    hidden = torch.randn(tokens, w[layout.up].shape[-1 if not layout.up_t else -2], generator=g).to(dtype)
    ids = torch.randperm(experts, generator=g).tolist()
    cut = [ids[: experts // 3], ids[experts // 3: 2 * experts // 3], ids[2 * experts // 3:]]
    parts = cut[:2] if host else [cut[0], cut[1] + cut[2]]  # with a host: the last third is in no part
    slices = [{n: t[torch.tensor(p)] for n, t in w.items()} for p in parts]

    with torch.no_grad():
        one = parts_rows(module, layout, slices, _table([e for p in parts for e in p], experts), hidden, index, weights)
        each = None
        for p, s in zip(parts, slices):
            r = part_rows(module, layout, s, _table(p, experts), hidden, index, weights)
            each = r if each is None else each + r
    firsts = torch.tensor([p[0] for p in parts[1:]])
    first = torch.isin(index.reshape(-1), firsts)
    assert torch.equal(one[~first], each[~first])
    torch.testing.assert_close(one[first], each[first], rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)
    if host:  # the pairs routed to no part are 0
        missing = torch.isin(index.reshape(-1), torch.tensor(cut[2]))
        assert missing.any() or tokens == 1
        assert torch.equal(one[missing], torch.zeros_like(one[missing]))


@pytest.mark.parametrize("arch", (*ARCHITECTURES, "biased"))
def test_a_part_stored_in_the_hosts_layout_gives_the_rows_of_the_modules(arch):
    """A split layer's host-memory experts are stored as the host reads them (``Layout.for_host``), which the GPU's
    pass reads beside its GPU-resident experts in the module's layout: each part with its own layout gives the rows
    the module's layout gives (the same products, the weights only stored transposed)."""
    module = _experts(arch)
    layout = Layout.of(module)
    host = layout.for_host()
    flipped = layout.flipped(host)
    assert flipped == ({layout.up, "down_proj"} if layout.up_t else set())  # [E, in, out] modules: both stored flipped
    w = {n: getattr(module, n).data for n in layout.names}
    experts, dtype = w[layout.up].shape[0], w[layout.up].dtype
    g = torch.Generator().manual_seed(9)
    k = min(4, experts)
    index = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(16)])
    weights = torch.rand(16, k, generator=g).to(dtype)
    hidden = torch.randn(16, w[layout.up].shape[-1 if not layout.up_t else -2], generator=g).to(dtype)
    ids = torch.randperm(experts, generator=g).tolist()
    parts = [ids[: experts // 2], ids[experts // 2:]]
    slices = [{n: t[torch.tensor(p)] for n, t in w.items()} for p in parts]
    stored = {n: t.transpose(-2, -1).contiguous() if n in flipped else t for n, t in slices[0].items()}
    table = _table(parts[0] + parts[1], experts)
    with torch.no_grad():
        want = parts_rows(module, layout, slices, table, hidden, index, weights)
        got = parts_rows(module, layout, [stored, slices[1]], table, hidden, index, weights, [host, layout])
    assert want.abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)


def test_a_part_of_one_expert_counts_only_its_own_pairs():
    """With one expert in all the parts, the count's range is still [0, 1] (histc over min == max would read the
    data's own range back, and count every pair)."""
    module = _experts("qwen3_moe")
    layout = Layout.of(module)
    w = {n: getattr(module, n).data for n in layout.names}
    experts = w[layout.up].shape[0]
    index = torch.tensor([[0, 1], [2, 0], [3, 1]])
    weights = torch.full((3, 2), 0.5, dtype=w[layout.up].dtype)
    hidden = torch.randn(3, w[layout.up].shape[-1], generator=torch.Generator().manual_seed(0)).to(weights.dtype)
    one = {n: t[:1] for n, t in w.items()}
    with torch.no_grad():
        rows = parts_rows(module, layout, [one], _table([0], experts), hidden, index, weights)
        alone = parts_rows(module, layout, [one], _table([0], experts), hidden[:1], index[:1, :1], weights[:1, :1])
    hit = index.reshape(-1) == 0
    assert torch.equal(rows[~hit], torch.zeros_like(rows[~hit]))
    assert torch.equal(rows[0], alone[0])
    with pytest.raises(ValueError, match="one expert or more"):
        parts_rows(module, layout, [one, {n: t[:0] for n, t in w.items()}], _table([0], experts), hidden, index,
                   weights)


@pytest.mark.parametrize("host", [False, True])
def test_a_split_forward_with_grad_on_runs_and_backpropagates(host):
    """Grad mode on (a plain ``model(ids)``): the GPU parts' pass picks rows without writing in place, so autograd
    takes it, and masks each part's input rows, whose grouped kernel leaves the gradient of rows past its last
    expert undefined (NaN on the CPU, found by this test), and zeroes the rows of the host's pairs before weighting
    them (their backward reads them). The gradients that reach the embeddings differ from the
    resident model's by no more than transformers' two experts kernels differ from each other (training is not
    supported while applied, but a grad-mode forward must not fail or give NaN)."""
    import runtime
    from moe_models import split_plan

    def embedding_grad(model, ids):
        model.zero_grad()
        out = model(ids).logits
        out.float().sum().backward()
        return out, model.model.embed_tokens.weight.grad.float().clone()

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(5))
    ref, want = embedding_grad(model, ids)
    model.set_experts_implementation("eager")
    tolerance = (embedding_grad(model, ids)[1] - want).abs().max().item()  # two kernels of the same experts
    model.set_experts_implementation("grouped_mm")
    places = None if host else (lambda n: {"gpu": list(range(0, n, 2)), "uva": list(range(1, n, 2))})  # thirds
    with runtime.apply(split_plan(model, places), model, device="cpu", host_threads=1):
        out, got = embedding_grad(model, ids)
    assert out.requires_grad and torch.equal(out, ref)
    assert not torch.isnan(got).any() and got.abs().max() > 0
    assert (got - want).abs().max().item() <= tolerance
