"""Bad input around strategy auto's prefer (now auto's as well as budget's) and its slots."""

from __future__ import annotations

from corpus.case import CliCase

SPEC = """model:
  name: toy
  dtype: bfloat16
  layers:
    - name: model.layers.{i}
      repeat: 6
      params:
        self_attn.q_proj.weight: [16, 16]
        mlp.up_proj.weight: [32, 16]
offload:
  strategy: auto
"""

GROUP = SPEC.replace("  strategy: auto\n", "  strategy: group\n  group_size: 2\n  prefer: [attention]\n")
CASES = [
    CliCase("auto-prefer-with-group-in-the-spec", ("plan", "{f}", "-g", "2KB"), {"bad.yaml": GROUP},
            expect=("offload", "strategy 'group' does not use it", "use strategy auto or budget")),
    CliCase("auto-prefer-misspelled-kind", ("plan", "{f}", "-g", "2KB", "--prefer", "atention"), {"bad.yaml": SPEC},
            expect=("prefer[0]", "did you mean 'attention'")),
    CliCase("auto-prefer-outside-kinds", ("plan", "{f}", "-g", "2KB", "--kinds", "dense_mlp", "--prefer", "attention"),
            {"bad.yaml": SPEC}, expect=("prefer names attention, which kinds leaves out",)),
    CliCase("auto-prefetch-step-zero", ("plan", "{f}", "-g", "2KB", "--prefetch-step", "0"), {"bad.yaml": SPEC},
            expect=("prefetch",)),
    CliCase("auto-prefer-empty-list", ("plan", "{f}", "-g", "2KB"),
            {"bad.yaml": SPEC.replace("  strategy: auto\n", "  strategy: auto\n  prefer: []\n")},
            expect=("prefer", "the list is empty")),
]
