"""Tensor parallel by whole attention heads (planner/tp/heads.py): with ``model.attention`` the q/k/v and o
splits follow vLLM's rules (a KV head replicated over ranks when there are more ranks than KV heads; a
world size the heads do not allow refused); without it the rows split as before and a note says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from planner.tp.split import ShardError, split_spec
from schemas.errors import InputError
from schemas.io import load_model
from schemas.spec import SpecFile

ROOT = Path(__file__).resolve().parent.parent
MIXTRAL = (ROOT / "examples/mixtral-8x7b.yaml").read_text()
HEADS = "  dtype: bfloat16\n  attention: {heads: 32, kv_heads: 8}\n"


def _spec(text: str) -> SpecFile:
    return load_model(SpecFile, "spec.yaml", text)


def _mixtral(attention: str = HEADS) -> SpecFile:
    return _spec(MIXTRAL.replace("  dtype: bfloat16\n", attention, 1))


def _attn(split, name: str) -> tuple[list[int], str]:
    p = split.spec.model.layers[1].params[f"self_attn.{name}.weight"]
    return list(p.shape), p.shard


def test_more_ranks_than_kv_heads_hold_one_whole_kv_head() -> None:
    """Mixtral (32 heads, 8 KV heads of 128 rows): at 16 and 32 ranks every rank holds a whole KV head,
    not 64 or 32 rows of one."""
    spec = _mixtral()
    for tp in (16, 32):
        split = split_spec(spec, tp)
        assert _attn(split, "k_proj") == ([128, 4096], "kv_head")
        assert _attn(split, "v_proj") == ([128, 4096], "kv_head")
        assert _attn(split, "q_proj") == ([4096 // tp, 4096], "dim0")
        assert _attn(split, "o_proj") == ([4096, 4096 // tp], "dim1")


def test_up_to_the_kv_heads_the_rows_split_as_before() -> None:
    for tp in (2, 4, 8):
        with_heads, without = split_spec(_mixtral(), tp), split_spec(_mixtral("  dtype: bfloat16\n"), tp)
        assert _attn(with_heads, "k_proj") == _attn(without, "k_proj") == ([1024 // tp, 4096], "dim0")
        assert not with_heads.by_rows and without.by_rows


def test_the_rank_plan_counts_the_whole_head() -> None:
    plans = planner.plan_ranks(_mixtral(), 16, gpu_budget=10**10)
    layer = plans[0].layer("model.layers.0")
    assert layer.params["self_attn.k_proj.weight"].bytes == 128 * 4096 * 2
    notes = " ".join(plans[0].summary.notes)
    assert "by KV head" in notes and "without the model's heads" not in notes


@pytest.mark.parametrize("tp, fragment", [
    (64, "its 32 attention heads do not split over 64 ranks"),  # the issue's --tp 64: vLLM refuses it too
    (12, "12 ranks are no multiple of its 8 KV heads"),
    (6, "its 8 KV heads do not split over 6 ranks"),
])
def test_splits_no_engine_makes_are_refused(tp: int, fragment: str) -> None:
    with pytest.raises(ShardError) as info:
        split_spec(_mixtral(), tp)
    assert fragment in str(info.value) and "self_attn" in str(info.value)


def test_a_fused_qkv_at_more_ranks_than_kv_heads_is_refused() -> None:
    text = """\
model:
  name: fused
  dtype: float16
  attention: {heads: 8, kv_heads: 2}
  layers:
    - name: blocks.{i}
      repeat: 2
      params:
        attn.qkv_proj.weight: [192, 128]
        attn.o_proj.weight: [128, 128]
"""
    assert split_spec(_spec(text), 2).spec.model.layers[0].params["attn.qkv_proj.weight"].shape == [96, 128]
    with pytest.raises(ShardError, match="fused q/k/v projection at more ranks"):
        split_spec(_spec(text), 4)


def test_without_heads_a_note_says_what_to_add() -> None:
    plans = planner.plan_ranks(_mixtral("  dtype: bfloat16\n"), 2, gpu_budget=4 * 10**10)
    notes = " ".join(plans[0].summary.notes)
    assert "split by rows without the model's heads" in notes and "model.attention" in notes


@pytest.mark.parametrize("attention, fragment", [
    ("{heads: 32, kv_heads: 5}", "kv_heads (5) must divide heads (32)"),
    ("{heads: 8, kv_heads: 16}", "kv_heads (16) must divide heads (8)"),
    ("{heads: 0}", "heads"),
    ("{heads: 32, kv: 8}", "kv"),
])
def test_bad_attention_sections(attention: str, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        _mixtral(f"  dtype: bfloat16\n  attention: {attention}\n")
    assert fragment in str(info.value) and "spec.yaml" in str(info.value)


@settings(max_examples=60, deadline=None)
@given(kv=st.sampled_from([1, 2, 4, 8, 16]), group=st.sampled_from([1, 2, 4]), head_dim=st.sampled_from([16, 64, 128]),
       tp=st.integers(1, 48))
def test_split_follows_the_engine_rule(kv: int, group: int, head_dim: int, tp: int) -> None:
    """Whatever the heads: refused exactly when an engine refuses; else every rank holds whole heads,
    max(1, kv / tp) of the KV heads and heads / tp of the query heads."""
    heads = kv * group
    text = f"""\
model:
  name: gqa
  dtype: float16
  attention: {{heads: {heads}, kv_heads: {kv}}}
  layers:
    - name: blocks.{{i}}
      repeat: 2
      params:
        self_attn.q_proj.weight: [{heads * head_dim}, 64]
        self_attn.k_proj.weight: [{kv * head_dim}, 64]
        self_attn.v_proj.weight: [{kv * head_dim}, 64]
        self_attn.o_proj.weight: [64, {heads * head_dim}]
"""
    engine_refuses = heads % tp != 0 or (tp <= kv and kv % tp != 0) or (tp > kv and tp % kv != 0)
    if engine_refuses:
        with pytest.raises(ShardError):
            split_spec(_spec(text), tp)
        return
    params = split_spec(_spec(text), tp).spec.model.layers[0].params
    assert params["self_attn.k_proj.weight"].shape[0] == head_dim * max(1, kv // tp)
    assert params["self_attn.q_proj.weight"].shape[0] == head_dim * heads // tp
    assert params["self_attn.o_proj.weight"].shape[1] == head_dim * heads // tp
