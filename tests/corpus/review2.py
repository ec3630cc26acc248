"""Bad input found in the second review: a world size set by the spec's ``parallel.tp`` (no --tp given),
so the message must name parallel.tp in the spec file, not a --tp flag the user never wrote."""

from __future__ import annotations

from cli_samples import TINY_SPEC
from corpus.case import CliCase

TP_SPEC = {"bad.yaml": TINY_SPEC + "parallel: {tp: 2}\n"}

CASES = [
    CliCase("review2-spec-tp-with-from-vllm", ("plan", "{f}", "--from-vllm", "--cpu-offload-gb 1", "-o", "{d}/out"),
            TP_SPEC, expect=("--from-vllm with parallel.tp: 2 (", "bad.yaml)")),
    CliCase("review2-spec-tp-output-a-file-name", ("plan", "{f}", "-o", "{d}/model.plan.yaml"), TP_SPEC,
            expect=("model.plan.yaml: looks like a file name", "parallel.tp: 2 (", "bad.yaml) writes one plan")),
    CliCase("review2-spec-tp-output-stdout", ("plan", "{f}", "-o", "-"), TP_SPEC,
            expect=("parallel.tp: 2 (", "bad.yaml) writes one plan per rank", "-o - gives none")),
]
