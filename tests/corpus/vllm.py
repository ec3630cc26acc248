"""Bad input to the vLLM bridge: `plan --from-vllm FLAGS` and `export --to vllm`.

One strict parser reads the flag string (planner/vllm/flags.py); each case is a different way a
vLLM command line goes wrong. All exit 2 with the flag named, except a budget the flags overrun (1).
"""

from __future__ import annotations

from corpus.case import CliCase

LLAMA = "examples/llama-3-8b.yaml"
NO_STACK = """\
model:
  name: flat
  dtype: float16
  layers:
    - name: embed
      params: {weight: [100, 8]}
    - name: head
      params: {weight: [100, 8]}
"""


def _flags(id: str, flags: str, *expect: str, exit: int = 2) -> CliCase:
    return CliCase(f"vllm-{id}", ("plan", LLAMA, "--from-vllm", flags), exit=exit, expect=expect)


CASES = [
    _flags("unknown-flag", "--cpu-offload-gigs 4", "unknown flag --cpu-offload-gigs",
           "did you mean '--cpu-offload-gb'"),
    _flags("other-vllm-flag", "--max-model-len 4096 --cpu-offload-gb 4", "unknown flag --max-model-len",
           "do not change what is offloaded"),
    _flags("abbreviation", "--offload-group 8", "abbreviations are not read", "--offload-group-size"),
    _flags("gb-with-unit", "--cpu-offload-gb 4GB", "--cpu-offload-gb must be a number of GiB", "write 4"),
    _flags("gb-negative", "--cpu-offload-gb -1", "--cpu-offload-gb must be a number of GiB", "'-1'"),
    _flags("gb-nan", "--cpu-offload-gb nan", "--cpu-offload-gb must be a number of GiB"),
    _flags("gb-inf", "--cpu-offload-gb 1e999", "--cpu-offload-gb must be a finite number"),
    _flags("gb-overflowing", "--cpu-offload-gb 1e300", "--cpu-offload-gb must be a number >= 0 and <=", "GiB",
           "(got 1e+300)"),
    _flags("gb-past-int64-bytes", "--cpu-offload-gb 1e10", "--cpu-offload-gb must be a number >= 0", "GiB"),
    _flags("group-past-int64", "--offload-group-size 99999999999999999999999", "--offload-group-size must be at "
           "most 2^63-1"),
    _flags("gb-two-values", "--cpu-offload-gb 4 8", "--cpu-offload-gb takes one value"),
    _flags("group-not-int", "--offload-group-size 2.5", "--offload-group-size must be a whole number"),
    _flags("in-group-zero", "--offload-group-size 4 --offload-num-in-group 0", "--offload-num-in-group must be >= 1"),
    _flags("in-group-over-group", "--offload-group-size 2 --offload-num-in-group 3",
           "--offload-num-in-group (3) must be <= --offload-group-size (2)"),
    _flags("prefetch-without-group", "--offload-backend prefetch",
           "--offload-num-in-group (1) must be <= --offload-group-size (0)"),
    _flags("step-zero", "--offload-group-size 4 --offload-prefetch-step 0", "--offload-prefetch-step must be >= 1"),
    _flags("params-commas", "--offload-group-size 4 --offload-params mlp,self_attn", "not commas",
           "--offload-params mlp self_attn"),
    _flags("params-dotted-edge", "--offload-group-size 4 --offload-params .mlp", "not a dotted name segment"),
    _flags("params-twice-listed", "--offload-group-size 4 --offload-params mlp mlp", "'mlp' is listed twice"),
    _flags("flag-twice", "--offload-group-size 4 --offload-group-size=8", "--offload-group-size is given twice"),
    _flags("missing-value", "--offload-prefetch-step", "--offload-prefetch-step needs a value"),
    _flags("empty-inline-value", "--offload-group-size=", "--offload-group-size needs a value"),
    _flags("bare-word", "8 --offload-group-size 4", "'8' is not a flag"),
    _flags("backend-typo", "--offload-backend prefetc", "--offload-backend must be one of auto, uva, prefetch",
           "did you mean 'prefetch'"),
    _flags("unbalanced-quote", "--offload-params 'mlp", "cannot split", "quote it as one argument"),
    CliCase("vllm-with-strategy", ("plan", LLAMA, "--from-vllm", "--offload-group-size 4", "--strategy", "group"),
            expect=("--strategy cannot go with it",)),
    CliCase("vllm-with-prefetch-step", ("plan", LLAMA, "--from-vllm", "--cpu-offload-gb 1", "--prefetch-step", "2"),
            expect=("--prefetch-step cannot go with it", "--offload-prefetch-step")),
    CliCase("vllm-no-block-stack", ("plan", "{f}", "--from-vllm", "--cpu-offload-gb 1"), files={"bad.yaml": NO_STACK},
            expect=("vLLM offloads only decoder layers", "this spec has none")),
    CliCase("vllm-over-budget", ("plan", LLAMA, "--gpu-budget", "8GB", "--from-vllm", "--cpu-offload-gb 1"), exit=1,
            expect=("over the", "gpu_budget", "smallest feasible gpu_budget for these flags")),
    CliCase("export-unknown-target", ("export", "{f}", "--to", "sglang"), files={"bad.yaml": "x: 1\n"},
            expect=("sglang",)),
    CliCase("export-no-target", ("export", "{f}"), files={"bad.yaml": "x: 1\n"}, expect=("--to",)),
    CliCase("export-not-a-plan", ("export", LLAMA, "--to", "vllm"), expect=("llama-3-8b.yaml",)),
]
