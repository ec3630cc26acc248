"""The host's grouped matmul kernel (runtime/host_matmul.py): each sum one bf16 rounding of a float32 sum, only the
touched experts read, the rows past an expert's own zero; the padded pass gives the rows torch.bmm's pass gives
(to a bf16 rounding of the sums' order); without a compiler the host's part runs torch.bmm as before."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moe_models import ARCHITECTURES, make_moe, random_call  # noqa: E402
from runtime import expert_math, host_matmul  # noqa: E402
from runtime.expert_math import Layout, host_rows, is_experts_module, rows_dtype  # noqa: E402

needs_kernel = pytest.mark.skipif(host_matmul.library() is None, reason="no C compiler: the kernel is not built")


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 values at each of ``x``'s magnitudes (8 significant bits)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(1e-30)))
    return torch.exp2(e - 7)


def _reference(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    ref = torch.einsum("bmk,bnk->bmn", x.double(), w[ids].double())
    for b, m in enumerate(rows.tolist()):
        ref[b, m:] = 0
    return ref


@needs_kernel
@pytest.mark.parametrize("k", (64, 72, 2048, 13))  # whole vectors, a tail, the H200 shape's hidden, all tail
@pytest.mark.parametrize("m", (1, 2, 5, 9))
def test_each_sum_is_one_rounding_of_the_exact_sum(k, m):
    g = torch.Generator().manual_seed(k * 100 + m)
    w = torch.randn(12, 40, k, generator=g).to(torch.bfloat16)
    x = torch.randn(5, m, k, generator=g).to(torch.bfloat16)
    ids = torch.tensor([11, 0, 7, 3, 7])
    rows = torch.tensor([m, 1, max(m - 1, 0), 0, m])
    y = host_matmul.grouped_rows(x, w, ids, rows)
    assert y.dtype == torch.bfloat16 and y.shape == (5, m, 40)
    ref = _reference(x, w, ids, rows)
    assert torch.all((y.double() - ref).abs() <= _ulp(ref)), "a sum off by more than one bf16 step"
    for b, r in enumerate(rows.tolist()):
        assert torch.all(y[b, r:] == 0)
        if r:
            assert y[b, :r].abs().sum() > 0


@needs_kernel
def test_the_experts_are_read_where_a_view_says_they_are():
    """A slice of the host's array ([cut:]), every other expert and a [E, N, K] view with padded rows: the kernel
    follows the view's strides, as torch.bmm does."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(16, 24, 40, generator=g).to(torch.bfloat16)
    x = torch.randn(3, 2, 32, generator=g).to(torch.bfloat16)
    ids, rows = torch.tensor([2, 0, 1]), torch.tensor([2, 2, 1])
    for w in (base[5:, :, :32], base[::2, :, :32], base[:, ::2, :32]):
        y = host_matmul.grouped_rows(x, w, ids, rows)
        ref = _reference(x, w, ids, rows)
        assert torch.all((y.double() - ref).abs() <= _ulp(ref))


@needs_kernel
def test_a_nan_or_inf_goes_through_as_it_would_in_a_matmul():
    w = torch.ones(2, 3, 16, dtype=torch.bfloat16)
    x = torch.ones(2, 1, 16, dtype=torch.bfloat16)
    x[0, 0, 3] = float("nan")
    x[1, 0, 4] = float("inf")
    y = host_matmul.grouped_rows(x, w, torch.tensor([0, 1]), torch.tensor([1, 1]))
    assert torch.isnan(y[0]).all() and torch.isinf(y[1]).all()


def test_mismatched_shapes_are_refused():
    w = torch.zeros(2, 3, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do not agree"):
        host_matmul.grouped_rows(torch.zeros(2, 1, 8), w, torch.tensor([0, 1]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="expert"):
        host_matmul.grouped_rows(torch.zeros(2, 1, 16), w, torch.tensor([0, 2]), torch.tensor([1, 1]))


@needs_kernel
def test_what_the_kernel_takes():
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    w = torch.zeros(3, 6, 8, dtype=torch.bfloat16)
    assert host_matmul.usable(x, w, False, 1)
    assert not host_matmul.usable(x, w, True, 1)  # stored [in, out]
    assert not host_matmul.usable(x, w, False, host_matmul.MAX_PASSES + 0.01)
    assert not host_matmul.usable(x.float(), w, False, 1)
    assert not host_matmul.usable(x, w.float(), False, 1)
    assert not host_matmul.usable(x, w.transpose(1, 2), False, 1)
    assert not host_matmul.usable(x.requires_grad_(), w, False, 1)
    with torch.no_grad():
        assert host_matmul.usable(x, w, False, 1)


def test_the_kernels_passes_count_each_touched_experts_blocks_of_rows():
    """An expert seeing r rows takes ceil(r / 4) passes of the kernel; untouched experts count for nothing."""
    assert host_matmul.passes(torch.tensor([0, 1, 4, 5, 8, 9, 0])) == (1 + 1 + 2 + 2 + 3) / 5
    assert host_matmul.passes(torch.tensor([2, 3, 4, 1])) == 1.0
    assert host_matmul.passes(torch.zeros(3, dtype=torch.int64)) == 0.0
    # about 4 rows an expert on average, most at 4 or fewer (PhiMoE at decode 32): the kernel's, not torch.bmm's
    assert host_matmul.passes(torch.tensor([4, 3, 5, 4, 2, 6, 4, 4, 3, 5])) <= host_matmul.MAX_PASSES
    assert host_matmul.passes(torch.tensor([6, 7, 5, 8])) > host_matmul.MAX_PASSES  # every expert past 4 rows


def _host_call(arch: str, tokens: int, seed: int):
    model = make_moe(arch)
    experts = next(m for m in model.modules() if is_experts_module(m))
    layout = Layout.of(experts).for_host()
    weights = {name: getattr(experts, name).detach() for name in layout.names}
    for name in weights:  # stored as the host stores them: [E, out, in]
        if name in Layout.of(experts).flipped(layout):
            weights[name] = weights[name].transpose(-2, -1).contiguous()
    n = weights["down_proj"].shape[0]
    hidden, index, topw = random_call(model.config, n, tokens, seed)
    k = model.config.num_experts_per_tok
    table = torch.arange(n)  # the part holds all but the last expert, whose id is the part's size: in no part

    def call() -> torch.Tensor:
        out = torch.zeros(tokens * k, model.config.hidden_size, dtype=rows_dtype(hidden, topw))
        with torch.no_grad():
            host_rows(experts, layout, {a: w[: n - 1] for a, w in weights.items()}, table, hidden, index, topw, out)
        return out

    return call


@needs_kernel
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("tokens", (1, 8, 32))
def test_the_kernels_rows_are_the_bmm_passes_to_a_rounding(arch, tokens, monkeypatch):
    """The host's part through the kernel against the same part through torch.bmm: the same pairs written (the
    last expert's, in no part, left zero), each row within the bf16 rounding the sums' order can move."""
    monkeypatch.setattr(host_matmul, "MAX_PASSES", 1 << 20)  # the kernel at every row count (the arithmetic here)
    call = _host_call(arch, tokens, seed=tokens)
    calls = []
    real = host_matmul.grouped_rows
    monkeypatch.setattr(host_matmul, "grouped_rows", lambda *a: calls.append(1) or real(*a))
    kernel = call()
    assert calls, "the kernel did not run"
    monkeypatch.setattr(host_matmul, "KERNEL", False)
    bmm = call()
    assert len(calls) == 2  # one call a projection, none with the kernel off
    assert torch.equal(kernel.abs().sum(-1) == 0, bmm.abs().sum(-1) == 0)
    assert bmm.abs().sum() > 0
    scale = bmm.abs().max().item()
    assert (kernel.float() - bmm.float()).abs().max().item() <= 2 ** -8 * scale


@needs_kernel
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_past_a_few_rows_a_touched_expert_the_host_runs_torch_bmm(arch, monkeypatch):
    """The kernel where a call's touched experts take at most ``MAX_PASSES`` passes of 4 rows on average (faster
    than torch.bmm there, slower past it on the H200's host); torch.bmm's padded pass above, whatever the most any
    expert sees."""
    calls = []
    real = host_matmul.grouped_rows
    monkeypatch.setattr(host_matmul, "grouped_rows", lambda *a: calls.append(1) or real(*a))
    _host_call(arch, 1, seed=3)()
    assert len(calls) == 2  # one token: a row an expert, the kernel for both projections
    many = _host_call(arch, 64, seed=3)
    calls.clear()
    many()  # 64 tokens over a tiny model's few experts: many rows each
    assert not calls
    monkeypatch.setattr(host_matmul, "MAX_PASSES", 1 << 20)
    many()
    assert len(calls) == 2


def test_without_a_compiler_the_host_runs_torch_bmm(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(host_matmul.shutil, "which", lambda _name: None)
    host_matmul.library.cache_clear()
    try:
        assert host_matmul.library() is None
        x = torch.zeros(4, 8, dtype=torch.bfloat16)
        assert not host_matmul.usable(x, torch.zeros(3, 6, 8, dtype=torch.bfloat16), False, 2)
        out = _host_call(ARCHITECTURES[0], 8, seed=3)()  # the padded pass through torch.bmm
        assert out.abs().sum() > 0
    finally:
        host_matmul.library.cache_clear()


def test_a_failed_build_is_said_once_and_the_host_runs_torch_bmm(monkeypatch, tmp_path, caplog):
    compiler = tmp_path / "cc"
    compiler.write_text("#!/bin/sh\necho 'cc: error: something is wrong' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    host_matmul.library.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="runtime"):
            assert host_matmul.library() is None
            assert host_matmul.library() is None
        said = [r.getMessage() for r in caplog.records if "not built" in r.getMessage()]
        assert len(said) == 1 and "something is wrong" in said[0]
        assert not list(tmp_path.rglob("*.so"))  # no half-written library left behind
    finally:
        host_matmul.library.cache_clear()


@needs_kernel
def test_the_build_is_cached_by_source_and_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    host_matmul.library.cache_clear()
    try:
        assert host_matmul.library() is not None
        built = list(tmp_path.rglob("host_matmul-*.so"))
        assert len(built) == 1
        stamp = built[0].stat().st_mtime_ns
        host_matmul.library.cache_clear()
        assert host_matmul.library() is not None
        assert [p.stat().st_mtime_ns for p in tmp_path.rglob("host_matmul-*.so")] == [stamp]  # reused, not rebuilt
    finally:
        host_matmul.library.cache_clear()


def test_apply_builds_the_kernel_before_any_forward(monkeypatch):
    """The build (a second or two) happens in ``apply``, not in the first forward's host part, whose time the
    guard would read as a slow host; a plan without host experts does not build it."""
    import runtime
    from moe_models import split_plan

    built = []
    monkeypatch.setattr(host_matmul, "library", lambda: built.append(1))
    model = make_moe(ARCHITECTURES[0])
    with runtime.apply(split_plan(model), model, device="cpu", host_threads=1):
        assert built == [1]
    built.clear()
    halves = lambda n: {"gpu": list(range(n // 2)), "uva": list(range(n // 2, n)), "cpu": []}  # noqa: E731
    uva_only = split_plan(model, places=halves)
    with runtime.apply(uva_only, model, device="cpu", host_threads=1):
        assert built == []


def test_the_passes_count_the_rows_the_kernel_takes_together():
    """``ROW_BLOCK`` is the kernel source's ``ROWS``: the rule's passes are the kernel's."""
    source = host_matmul.SOURCE.read_text()
    assert f"#define ROWS {host_matmul.ROW_BLOCK} " in source
