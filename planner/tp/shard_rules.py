"""How tensor parallelism splits a param by default: one table of rules over its kind and name.

A param is matched by its kind (schemas/kinds.py, or the spec's ``kind:``), the module that holds it
(the name segment before ``weight``/``bias``) and its own name; the first rule that matches decides.
A registered buffer is never split. A param no rule matches stays whole on every rank (replicated);
the plan's notes say how many bytes that leaves replicated, and a ``shard:`` in the spec splits it.
A param's ``shard:`` in the spec overrides all of this. docs/DESIGN.md, "Tensor parallel", says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.kinds import is_experts_container, param_kind

ATTENTION = frozenset({"attention"})
MLP = frozenset({"dense_mlp", "shared_experts", "routed_experts"})  # routed: one Linear per expert

QKV = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "wq", "wk", "wv", "wqkv", "query_key_value",
                 "query", "key", "value", "q_b_proj", "kv_b_proj"})
ATTENTION_OUT = frozenset({"o_proj", "wo", "out_proj", "dense"})
LOW_RANK = frozenset({"q_a_proj", "kv_a_proj_with_mqa", "fused_qkv_a_proj"})  # MLA's small down-projections
GATE_UP = frozenset({"gate_proj", "up_proj", "gate_up_proj", "w1", "w3", "fc1", "dense_h_to_4h"})
DOWN = frozenset({"down_proj", "w2", "fc2", "dense_4h_to_h"})
VOCAB = frozenset({"embed_tokens", "wte", "tok_embeddings", "word_embeddings", "embed_in", "lm_head",
                   "embed_out"})
WEIGHT_BIAS = frozenset({"weight", "bias"})
ANY: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Rule:
    what: str  # what the rule covers, in the plan's words
    kinds: frozenset[str]
    shard: str
    modules: frozenset[str] = ANY  # the module holding the tensor; empty: any
    tensors: frozenset[str] = ANY  # the tensor's own name; empty: any
    stacked: bool | None = None  # routed experts: all experts in one tensor (True) or one Linear each (False)


RULES: tuple[Rule, ...] = (
    Rule("norms", frozenset({"norm"}), "replicated"),
    Rule("routers", frozenset({"router"}), "replicated"),
    Rule("quantization scales", frozenset({"scale"}), "replicated"),
    Rule("stacked routed experts", frozenset({"routed_experts"}), "experts", stacked=True),
    Rule("MLA low-rank projections", ATTENTION, "replicated", LOW_RANK),
    Rule("attention q/k/v", ATTENTION, "dim0", QKV, WEIGHT_BIAS),
    Rule("attention output", ATTENTION, "dim1", ATTENTION_OUT, frozenset({"weight"})),
    Rule("attention output bias", ATTENTION, "replicated", ATTENTION_OUT, frozenset({"bias"})),
    Rule("MLP gate/up", MLP, "dim0", GATE_UP, WEIGHT_BIAS, stacked=False),
    Rule("MLP down", MLP, "dim1", DOWN, frozenset({"weight"}), stacked=False),
    Rule("MLP down bias", MLP, "replicated", DOWN, frozenset({"bias"}), stacked=False),
    Rule("token embedding and LM head", frozenset({"embedding"}), "vocab", VOCAB, frozenset({"weight"})),
)

BUFFER = Rule("registered buffers", ANY, "replicated")


def _stacked(segments: list[str]) -> bool:
    """Routed experts held in one tensor: no numbered expert (``experts.3.w1``) below the experts container."""
    for i, seg in enumerate(segments):
        if is_experts_container(seg):
            return not any(s.isdigit() for s in segments[i + 1:])
    return True


def _matches(rule: Rule, kind: str, module: str, tensor: str, stacked: bool) -> bool:
    return (kind in rule.kinds and (not rule.modules or module in rule.modules)
            and (not rule.tensors or tensor in rule.tensors)
            and (rule.stacked is None or kind != "routed_experts" or rule.stacked == stacked))


def default_rule(layer: str, name: str, kind: str | None = None, buffer: bool = False) -> Rule | None:
    """The rule that splits param ``name`` of ``layer`` (``kind``: the spec's explicit kind), or None
    when none matches (the param stays whole on every rank)."""
    if buffer:
        return BUFFER
    resolved = param_kind(layer, name, kind)
    segments = f"{layer}.{name}".lower().split(".")
    tensor = segments[-1]
    module = segments[-2] if len(segments) > 1 else ""
    stacked = resolved == "routed_experts" and _stacked(segments)
    for rule in RULES:
        if _matches(rule, resolved, module, tensor, stacked):
            return rule
    return None
