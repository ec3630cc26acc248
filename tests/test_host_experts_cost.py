"""The cost of a layer whose experts are split by expert (planner/cost/host_experts.py)."""

from __future__ import annotations

import pytest

from planner.cost.host_experts import cpu_max_tokens, split_work
from schemas.hardware import load_hardware
from schemas.plan_content import PlanLayer, PlanParam
from schemas.plan_experts import ExpertSplit
from schemas.spec_layers import MoeSpec

E, K = 128, 8
HW = load_hardware("h200")


def layer(**places) -> PlanLayer:
    """A Qwen3-MoE-shaped layer (hidden 2048, expert width 768) split as ``places`` says."""
    params = {"attn.q_proj.weight": PlanParam(shape=[4096, 2048], dtype="bfloat16", bytes=4096 * 2048 * 2),
              "mlp.experts.gate_up_proj": PlanParam(shape=[E, 1536, 2048], dtype="bfloat16", bytes=E * 1536 * 2048 * 2),
              "mlp.experts.down_proj": PlanParam(shape=[E, 2048, 768], dtype="bfloat16", bytes=E * 2048 * 768 * 2)}
    split = ExpertSplit(params=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], **places)
    return PlanLayer.model_construct(name="model.layers.0", params=params, offloaded=list(split.params), uva=[],
                                     tied={}, moe=MoeSpec(experts=E, top_k=K), experts=split, prefetch=None)


def test_hot_experts_that_take_the_tokens_cut_the_link_time():
    hot = list(range(26))
    split = layer(gpu=hot, uva=list(range(26, E)))
    uniform = split_work(split, 1, HW)
    skewed = [0.8 * K / 26 if e in hot else 0.2 * K / (E - 26) for e in range(E)]
    measured = split_work(split, 1, HW, skewed)
    assert measured.gpu_ms < 0.5 * uniform.gpu_ms
    assert measured.synced_gpu_ms is None  # no host part: nothing to wait for mid-layer


def test_the_host_part_runs_beside_the_gpu_parts_and_joins():
    work = split_work(layer(uva=list(range(64)), cpu=list(range(64, E))), 32, HW)
    assert work.synced_gpu_ms is not None and work.synced_gpu_ms > 0 and work.synced_cpu_ms > 0
    assert work.cpu_ms > work.synced_cpu_ms  # issue time first, then the host's experts
    alone = split_work(layer(cpu=list(range(E))), 32, HW)
    assert alone.synced_cpu_ms > work.synced_cpu_ms  # twice the experts on the host, alone on host memory


@pytest.mark.parametrize("tokens", [1, 32, 2048])
def test_above_cpu_max_tokens_the_gpu_reads_the_host_experts(tokens):
    places = {"cpu": list(range(E))}
    limit = cpu_max_tokens(layer(**places), HW)
    assert limit is not None and 32 <= limit < 2048  # the host is bound by reading its experts up to there
    work = split_work(layer(**places, cpu_max_tokens=limit), tokens, HW)
    assert (work.synced_gpu_ms is not None) == (tokens <= limit)


def test_a_split_layer_keeps_its_attention_over_the_context():
    """The layer's other params are costed with the forward's sequences: a decode over 4,095 cached tokens a
    sequence adds the attention over them (planner/cost/block.py) to the GPU time, host experts or not."""
    from planner.cost.block import Sequences, block_ms, block_shape

    attn = {f"attn.{n}_proj.weight": PlanParam(shape=[rows, 2048], dtype="bfloat16", bytes=rows * 2048 * 2)
            for n, rows in (("q", 4096), ("k", 512), ("v", 512), ("o", 2048))}
    base = layer(uva=list(range(64)), cpu=list(range(64, E)))
    full = base.model_copy(update={"params": {**attn, **base.params}})
    seqs = Sequences(32, 4095)
    with_context = split_work(full, 32, HW, None, seqs).gpu_ms - split_work(full, 32, HW).gpu_ms
    shape = block_shape([(rel, p, "matmul") for rel, p in attn.items()], None)
    # (without sequences the 32 tokens are one sequence's: a few more query-key pairs than 32 sequences' own)
    assert with_context == pytest.approx(block_ms(shape, 32, seqs, HW) - block_ms(shape, 32, Sequences(32, 0), HW),
                                         rel=1e-4)
    assert with_context > 1  # 32 x 4,096 tokens of grouped keys and values, repeated for 32 query heads
