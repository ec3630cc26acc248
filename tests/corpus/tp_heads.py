"""Tensor parallel by attention heads (planner/tp/heads.py): world sizes no engine splits the heads over,
shapes that are no whole number of heads, and bad `model.attention` sections. Exit 2 with the file, the
line, the param and the heads."""

from __future__ import annotations

from corpus.case import CliCase


def spec(heads: int, kv: int, head_dim: int, attention: str | None = None, q_rows: int | None = None) -> str:
    q = q_rows if q_rows is not None else heads * head_dim
    return f"""\
model:
  name: gqa
  dtype: float16
  {attention or f"attention: {{heads: {heads}, kv_heads: {kv}}}"}
  layers:
    - name: blocks.{{i}}
      repeat: 2
      params:
        self_attn.q_proj.weight: [{q}, 64]
        self_attn.k_proj.weight: [{kv * head_dim}, 64]
        self_attn.v_proj.weight: [{kv * head_dim}, 64]
        self_attn.o_proj.weight: [64, {q}]
"""


def _case(id: str, text: str, tp: str, *expect: str) -> CliCase:
    return CliCase(f"tp-heads-{id}", ("plan", "{f}", "--tp", tp, "-g", "1MB", "-o", "{d}/out"), {"bad.yaml": text},
                   expect=expect)


CASES = [
    _case("more-ranks-than-heads", spec(8, 2, 16), "16", "bad.yaml:9", "self_attn.q_proj.weight",
          "its 8 attention heads do not split over 16 ranks"),
    _case("ranks-no-multiple-of-kv-heads", spec(12, 4, 8), "6", "bad.yaml:10", "self_attn.k_proj.weight",
          "6 ranks are no multiple of its 4 KV heads"),
    _case("kv-heads-do-not-split", spec(12, 6, 8), "4", "bad.yaml:10", "self_attn.k_proj.weight",
          "its 6 KV heads do not split over 4 ranks"),
    _case("rows-not-whole-heads", spec(8, 2, 16, q_rows=100), "2", "bad.yaml:9", "self_attn.q_proj.weight",
          "100 rows are no whole number of its 8 heads"),
    _case("kv-heads-not-dividing-heads", spec(8, 3, 16), "2", "bad.yaml:4", "kv_heads (3) must divide heads (8)"),
    _case("heads-a-bool", spec(8, 2, 16, "attention: {heads: true}"), "2", "bad.yaml:4", "heads"),
    _case("unknown-key", spec(8, 2, 16, "attention: {heads: 8, kv: 2}"), "2", "bad.yaml:4", "kv"),
]
