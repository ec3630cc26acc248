"""Bad workload, hardware-profile and MoE inputs: on the command line and in spec files."""

from __future__ import annotations

from cli_samples import TINY_SPEC

from corpus.case import CliCase

PLAN = ("plan", "{f}", "--gpu-budget", "2KB")


def spec_with(old: str, new: str) -> str:
    assert old in TINY_SPEC, old
    return TINY_SPEC.replace(old, new, 1)


PROFILE = """\
name: mine
source: a test
h2d_gbps: 50
uva_gbps: 40
uva_passes: [{tokens: 1, passes: 1.0}]
gpu_mem_gbps: 2000
matmul_tflops: 500
launch_us: 8
block_cpu_us: 500
moe_block_cpu_us: 900
expert_cpu_us: 0
copy_call_us: 4
"""


def _cli(id: str, *args: str, text: str = TINY_SPEC, expect: tuple[str, ...], files: dict | None = None) -> CliCase:
    return CliCase(id, (*PLAN, *args), files={"bad.yaml": text, **(files or {})}, expect=expect)


CASES = [
    _cli("workload-tokens-not-a-number", "--workload", "prefill=lots", expect=("--workload", "'lots'", "whole number")),
    _cli("workload-tokens-zero", "--workload", "decode=0", expect=("--workload", "from 1 to")),
    _cli("workload-tokens-negative", "--workload", "decode=-3", expect=("--workload", "whole number")),
    _cli("workload-tokens-float", "--workload", "prefill=20.5", expect=("--workload", "'20.5'")),
    _cli("workload-unknown-name-without-tokens", "--workload", "chat", expect=("--workload", "give the token count")),
    _cli("workload-weight-zero", "--workload", "decode=1:0", expect=("--workload", "the weight must be a number >= 1e-06")),
    _cli("workload-weight-nan", "--workload", "decode=1:nan", expect=("--workload", "the weight must be a number >= 1e-06")),
    _cli("workload-weight-junk", "--workload", "decode=1:x", expect=("--workload", "'x'")),
    _cli("workload-given-twice", "--workload", "decode", "--workload", "decode=4", expect=("decode given twice",)),
    _cli("workload-and-tokens-clash", "--workload", "decode", "--tokens", "4", expect=("--tokens sets the decode",)),
    _cli("workload-empty", "--workload", "", expect=("--workload", "an empty value; give NAME[=TOKENS|=auto][@CONTEXT][:WEIGHT]")),
    _cli("workload-bad-name", "--workload", "9lives=4", expect=("--workload", "must be letters")),
    _cli("tokens-zero", "--tokens", "0", expect=("--tokens",)),
    _cli("hardware-unknown-name", "--hardware", "h20", expect=("--hardware", "did you mean 'h200'")),
    _cli("hardware-missing-file", "--hardware", "{d}/nope.yaml", expect=("nope.yaml", "no such file")),
    _cli("hardware-file-bad-key", "--hardware", "{d}/gpu.yaml", expect=("gpu.yaml:3:", "h2d_gbs", "did you mean 'h2d_gbps'"),
         files={"gpu.yaml": PROFILE.replace("h2d_gbps", "h2d_gbs")}),
    _cli("hardware-file-rate-quoted", "--hardware", "{d}/gpu.yaml", expect=("gpu.yaml:3:", "h2d_gbps"),
         files={"gpu.yaml": PROFILE.replace("h2d_gbps: 50", "h2d_gbps: '50'")}),
    _cli("hardware-file-moe-sync-yes", "--hardware", "{d}/gpu.yaml", expect=("gpu.yaml:", "moe_sync", "boolean"),
         files={"gpu.yaml": PROFILE + "moe_sync: 'yes'\n"}),
    _cli("hardware-file-passes-as-bool", "--hardware", "{d}/gpu.yaml", expect=("gpu.yaml:5:", "passes"),
         files={"gpu.yaml": PROFILE.replace("passes: 1.0}", "passes: true}")}),
    _cli("hardware-file-negative-rate", "--hardware", "{d}/gpu.yaml", expect=("gpu.yaml:4:", "uva_gbps", ">= 0.001"),
         files={"gpu.yaml": PROFILE.replace("uva_gbps: 40", "uva_gbps: -40")}),
    _cli("hardware-file-unsorted-passes", "--hardware", "{d}/gpu.yaml", expect=("gpu.yaml:5:", "increasing tokens"),
         files={"gpu.yaml": PROFILE.replace("[{tokens: 1, passes: 1.0}]",
                                            "[{tokens: 64, passes: 1.0}, {tokens: 1, passes: 1.0}]")}),
    _cli("hardware-file-passes-below-one", "--hardware", "{d}/gpu.yaml", expect=("gpu.yaml:5:", "uva_passes[0].passes", ">= 1"),
         files={"gpu.yaml": PROFILE.replace("passes: 1.0", "passes: 0.5")}),
    _cli("hardware-file-is-a-spec", "--hardware", "{d}/gpu.yaml",
         expect=("gpu.yaml:1:", "this is a spec file, not a hardware profile"),
         files={"gpu.yaml": TINY_SPEC}),
    _cli("spec-workload-tokens-string", text=spec_with("offload:", "workload: {decode: {tokens: '1'}}\noffload:"),
         expect=("bad.yaml:", "workload.decode.tokens", "whole number")),
    _cli("spec-workload-empty", text=spec_with("offload:", "workload: {}\noffload:"),
         expect=("bad.yaml:", "workload", "empty")),
    _cli("spec-workload-unknown-key", text=spec_with("offload:", "workload: {decode: {tokns: 1}}\noffload:"),
         expect=("bad.yaml:", "tokns", "did you mean 'tokens'")),
    _cli("spec-hardware-unknown", text=spec_with("offload:", "hardware: a100\noffload:"),
         expect=("no bundled profile 'a100'",)),
    _cli("spec-moe-top-k-over-experts",
         text=spec_with("      repeat: 4\n", "      repeat: 4\n      moe: {experts: 4, top_k: 8}\n"),
         expect=("bad.yaml:", "top_k (8) is larger than experts (4)")),
    _cli("spec-moe-zero-experts",
         text=spec_with("      repeat: 4\n", "      repeat: 4\n      moe: {experts: 0, top_k: 1}\n"),
         expect=("bad.yaml:", "moe.experts", "> 0")),
    _cli("spec-moe-bool-top-k",
         text=spec_with("      repeat: 4\n", "      repeat: 4\n      moe: {experts: 8, top_k: true}\n"),
         expect=("bad.yaml:", "moe.top_k")),
]

CASES.append(CliCase("calibrate-without-a-gpu", ("calibrate", "-o", "{d}/gpu.yaml"), exit=2,
                     expect=("calibrate measures a CUDA GPU",)))
