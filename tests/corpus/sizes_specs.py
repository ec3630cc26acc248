"""Bad sizes and spec contents: sizes on the command line and in files, caps on what a spec may
describe, strict whole numbers, unprintable names and inconsistent ties."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli_samples import TINY_SPEC
from pydantic import ValidationError

from corpus.case import ApiCase, CliCase
from schemas.errors import InputError


def edit(old: str, new: str) -> str:
    """TINY_SPEC with one edit (the edit must apply, so a case never tests the good spec by mistake)."""
    assert old in TINY_SPEC, old
    return TINY_SPEC.replace(old, new, 1)


def plan_with(flag: str, value: str, id: str, *expect: str) -> CliCase:
    """``planner plan`` of the good spec with one bad size flag (given as ``--flag=value``)."""
    return CliCase(id, ("plan", "{f}", f"{flag}={value}"), {"bad.yaml": TINY_SPEC}, expect=(flag, *expect))


def validate(id: str, text: str, *expect: str) -> CliCase:
    return CliCase(id, ("validate", "{f}"), {"bad.yaml": text}, expect=expect)


def add_layer(yaml_lines: str) -> str:
    """TINY_SPEC with one more layer after ``head`` (``yaml_lines`` indented as a list item)."""
    return edit("        weight: [100, 8]\nmemory:", f"        weight: [100, 8]\n{yaml_lines}memory:")


HUGE_DIGITS = "9" * 5000

CLI_SIZES = [
    plan_with("--gpu-budget", "12GB;rm", "cli-size-trailing-command", "nothing may follow the unit", "'12GB;rm'"),
    plan_with("--gpu-budget", "1,5GB", "cli-size-decimal-comma", "a decimal point is '.'"),
    plan_with("--gpu-budget", "1.5.5GB", "cli-size-two-decimal-points", "more than one decimal point"),
    plan_with("--gpu-budget", "12e-9GB", "cli-size-exponent-with-unit", "no exponents"),
    plan_with("--gpu-budget", "1e-3", "cli-size-bare-exponent", "no exponents", "'1e-3'"),
    plan_with("--gpu-budget", "-5GB", "cli-size-negative", "must be > 0 (got '-5GB')", "positive"),
    plan_with("--gpu-budget", "0", "cli-size-zero", "must be > 0 (got '0')"),
    plan_with("--cpu-budget", "0.0001KB", "cli-size-under-a-byte", "less than 1 byte"),
    plan_with("--gpu-budget", "9223372036854775808", "cli-size-over-int64", "at most 2^63-1 bytes"),
    plan_with("--gpu-budget", "12 GiG", "cli-size-misspelled-unit", "unknown size unit 'GiG'", "did you mean 'GiB'?"),
    plan_with("--gpu-budget", "nan", "cli-size-nan", "expected a size such as 20GB", "(got 'nan')"),
    plan_with("--cpu-budget", "inf", "cli-size-inf", "(got 'inf')"),
    plan_with("--gpu-budget", "1.5", "cli-size-fractional-bytes", "a number of bytes must be whole", "1.5GB"),
    plan_with("--gpu-budget", "12GB\x1b[2J", "cli-size-escape-sequence", "'12GB\\x1b[2J'"),
    plan_with("--gpu-budget", "\u0661\u0662GB", "cli-size-arabic-indic-digits", "expected a size such as 20GB"),
    plan_with("--gpu-budget", "20 000 MB", "cli-size-grouped-digits", "expected a size such as 20GB"),
    plan_with("--gpu-budget", "9" * 80, "cli-size-eighty-digits", "too long to be a size"),
    plan_with("--gpu-budget", "12GB\x1f", "cli-size-unit-separator", "(got '12GB\\x1f'"),
    plan_with("--gpu-budget", "\u200312GB", "cli-size-em-space", "(got '\\u200312GB')"),
]

FILE_SIZES = [
    validate("file-size-true", edit("gpu_budget: 2KB", "gpu_budget: true"),
             "bad.yaml:18:", "memory.gpu_budget", "(got True: a true/false value, not a size)"),
    validate("file-size-yes-is-a-bool", edit("gpu_budget: 2KB", "gpu_budget: 2KB\n  cpu_budget: yes"),
             "bad.yaml:19:", "memory.cpu_budget", "a true/false value"),
    validate("file-size-float", edit("gpu_budget: 2KB", "gpu_budget: 1.5e+10"),
             "bad.yaml:18:", "memory.gpu_budget", "a float, not a size"),
    validate("file-size-trailing-junk", edit("gpu_budget: 2KB", "gpu_budget: 2KB of VRAM"),
             "bad.yaml:18:", "memory.gpu_budget", "nothing may follow the unit"),
    validate("file-size-list", edit("gpu_budget: 2KB", "gpu_budget: [2, KB]"),
             "bad.yaml:18:", "memory.gpu_budget", "a list, not a size"),
    validate("file-size-negative-int", edit("gpu_budget: 2KB", "gpu_budget: -5"),
             "bad.yaml:18:", "memory.gpu_budget", "must be > 0 (got -5)"),
    validate("file-size-over-int64", edit("gpu_budget: 2KB", "gpu_budget: 10EiB"),
             "bad.yaml:18:", "memory.gpu_budget", "at most 2^63-1 bytes"),
]

CAPS = [
    validate("repeat-ten-million", edit("repeat: 4", "repeat: 10000000"),
             "bad.yaml:8:", "model.layers[1]", "expands to 10,000,002 layers, more than the 100,000 supported"),
    CliCase("repeat-ten-million-plan", ("plan", "{f}", "-g", "1GB"), {"bad.yaml": edit("repeat: 4", "repeat: 10000000")},
            expect=("bad.yaml:8:", "more than the 100,000 supported")),
    validate("params-over-two-million",
             edit("repeat: 4", "repeat: 99000").replace(
                 "        norm.weight: [8]\n",
                 "        norm.weight: [8]\n" + "".join(f"        extra.p{k}: [1]\n" for k in range(18)), 1),
             "bad.yaml:8:", "expands to 2,079,002 params and tied names, more than the 2,000,000 supported"),
    validate("int-of-5000-digits", edit("repeat: 4", f"repeat: {HUGE_DIGITS}"),
             "bad.yaml:9:", "a number of more than 100 digits"),
    validate("hex-int-of-5000-digits", edit("mlp.w1: [32, 8]", f"mlp.w1: [32, 0x{'f' * 5000}]"),
             "bad.yaml:11:", "a number of more than 100 digits"),
    validate("dim-beyond-int64", edit("mlp.w1: [32, 8]", "mlp.w1: [100000000000000000000000000000000, 8]"),
             "bad.yaml:11:", "params['mlp.w1'].shape[0]", "at most 2^63-1"),
    validate("tensor-over-a-pebibyte", edit("mlp.w1: [32, 8]", "mlp.w1: [33554432, 33554432]"),
             "bad.yaml:8:", "param 'mlp.w1' takes 2048.00 TiB (float16), more than the 1 PiB"),
    validate("model-over-a-pebibyte", edit("mlp.w1: [32, 8]", "mlp.w1: [16777216, 16777216]"),
             "bad.yaml:8:", "the model's params and buffers take 2048.00 TiB, more than the 1 PiB (2^50 bytes)"),
    validate("stride-span-over-a-pebibyte",
             edit("norm.weight: [8]", "norm.weight: {shape: [2, 8], stride: [1125899906842624, 1]}"),
             "bad.yaml:8:", "param 'norm.weight' takes"),
    validate("impossible-date-scalar", edit("  name: tiny", "  name: 2024-02-30"),
             "bad.yaml:2:", "cannot read '2024-02-30' as a timestamp", "quote it"),
]

STRICT_TYPES = [
    validate("shape-dim-bool", edit("mlp.w1: [32, 8]", "mlp.w1: [true, 8]"),
             "bad.yaml:11:", "params['mlp.w1'].shape[0]", "expected a whole number (got True)"),
    validate("shape-dim-string", edit("mlp.w2: [8, 32]", "mlp.w2: [8, '32']"),
             "bad.yaml:12:", "params['mlp.w2'].shape[1]", "(got '32')"),
    validate("repeat-string", edit("repeat: 4", 'repeat: "4"'),
             "bad.yaml:9:", "model.layers[1].repeat", "expected a whole number (got '4')"),
    validate("repeat-float", edit("repeat: 4", "repeat: 4.0"),
             "bad.yaml:9:", "model.layers[1].repeat", "(got 4.0)"),
    validate("start-bool", edit("repeat: 4", "repeat: 4\n      start: on"),
             "bad.yaml:10:", "model.layers[1].start", "(got True)"),
    validate("stride-string", edit("norm.weight: [8]", "norm.weight: {shape: [8], stride: ['1']}"),
             "bad.yaml:13:", "params['norm.weight'].stride[0]", "(got '1')"),
    validate("buffer-string", edit("norm.weight: [8]", "norm.weight: {shape: [8], buffer: 'no'}"),
             "bad.yaml:13:", "params['norm.weight'].buffer", "(got 'no')"),
    validate("group-size-float", edit("backend: uva", "backend: uva\n  strategy: group\n  group_size: 2.5"),
             "bad.yaml:24:", "offload.group_size", "(got 2.5)"),
    validate("prefetch-step-bool", edit("backend: uva", "backend: prefetch\n  prefetch_step: true"),
             "bad.yaml:23:", "offload.prefetch_step", "(got True)"),
]

NAMES = [
    validate("layer-name-escape-sequence", edit("name: head", 'name: "head\\e[31m"'),
             "bad.yaml:14:", "model.layers[2].name", "'head\\x1b[31m'", "U+001B", "must be printable"),
    validate("layer-name-bidi-override", edit("name: head", 'name: "head\\u202Etxt.exe"'),
             "bad.yaml:14:", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    validate("param-name-zero-width", edit("mlp.w1: [32, 8]", '"mlp.w\\u200B1": [32, 8]'),
             "bad.yaml:10:", "model.layers[1].params", "U+200B (ZERO WIDTH SPACE)"),
    validate("model-name-newline", edit("  name: tiny", '  name: "tiny\\nrm -rf /"'),
             "bad.yaml:2:", "model.name", "U+000A"),
    validate("tie-target-byte-order-mark",
             edit("        weight: [100, 8]\nmemory", '        bias: [8]\n      tied: {weight: "\\uFEFFembed.weight"}\nmemory'),
             "bad.yaml:", "model.layers[2].tied", "U+FEFF"),
    validate("offload-segment-next-line", edit("backend: uva", 'backend: uva\n  params: ["mlp\\N"]'),
             "bad.yaml:23:", "offload.params", "U+0085"),
    validate("layer-name-not-nfc", edit("name: head", 'name: "he\\u0301ad"'),
             "bad.yaml:14:", "not in Unicode normal form NFC"),
]

TIES = [
    validate("tie-name-is-another-layers-param",
             add_layer("    - name: blocks\n      tied: {1.norm.weight: blocks.0.mlp.w1}\n"),
             "bad.yaml:", "layer 'blocks.1': param 'norm.weight' has shape [8], but layer 'blocks' ties it to "
             "'blocks.0.mlp.w1', whose shape is [32, 8]"),
    validate("param-listed-by-two-nested-layers",
             add_layer("    - name: blocks\n      params: {2.mlp.w1: [32, 8]}\n"),
             "bad.yaml:17:", "layer 'blocks': param '2.mlp.w1' is the tensor 'blocks.2.mlp.w1'"),
    validate("tie-to-itself", edit("        weight: [100, 8]\nmemory", "        bias: [8]\n      tied: {weight: head.weight}\nmemory"),
             "bad.yaml:14:", "tied param 'weight' points to 'head.weight', itself"),
    validate("tie-chain", add_layer("    - name: lm_head\n      tied: {weight: extra.weight}\n"
                                    "    - name: extra\n      tied: {weight: embed.weight}\n"),
             "bad.yaml:17:", "points to 'extra.weight', which is itself tied", "tie it to 'embed.weight'"),
    validate("tie-cycle", add_layer("    - name: p\n      tied: {w: q.w}\n    - name: q\n      tied: {w: p.w}\n"),
             "bad.yaml:17:", "a chain of ties must end at a param"),
    CliCase("tie-clash-plan", ("plan", "{f}", "-g", "1GB"),
            {"bad.yaml": add_layer("    - name: blocks\n      tied: {3.mlp.w1: blocks.0.mlp.w2}\n")},
            expect=("bad.yaml:", "param 'mlp.w1' has shape [32, 8]", "whose shape is [8, 32]")),
]


def _tiny(tmp: Path) -> Any:
    from schemas.io import load_model
    from schemas.spec import SpecFile

    path = tmp / "tiny.yaml"
    path.write_text(TINY_SPEC)
    return load_model(SpecFile, path)


def _plan(**options: Any) -> Any:
    def call(tmp: Path) -> Any:
        import planner

        return planner.plan(_tiny(tmp), **options)

    return call


def _validate(data: Any) -> Any:
    def call(tmp: Path) -> Any:
        from schemas.spec import SpecFile

        return SpecFile.model_validate(data)

    return call


def _load(text: str) -> Any:
    def call(tmp: Path) -> Any:
        from schemas.io import load_spec

        (tmp / "s.yaml").write_text(text)
        return load_spec(tmp / "s.yaml")

    return call


def _parse(value: Any) -> Any:
    def call(tmp: Path) -> Any:
        from schemas.sizes import parse_size

        return parse_size(value)

    return call


_ONE_LAYER = {"name": "blocks.{i}", "repeat": 10_000_000, "params": {"w": [4]}}

API = [
    ApiCase("api-plan-negative-budget", _plan(gpu_budget=-5), ValidationError, ("gpu_budget", "must be > 0 (got -5)")),
    ApiCase("api-plan-bool-budget", _plan(gpu_budget=True), ValidationError, ("gpu_budget", "a true/false value")),
    ApiCase("api-plan-junk-cpu-budget", _plan(cpu_budget="12GB;rm"), ValidationError,
            ("cpu_budget", "nothing may follow the unit")),
    ApiCase("api-plan-float-budget", _plan(gpu_budget=1.2e10), ValidationError, ("gpu_budget", "a float")),
    ApiCase("api-plan-bool-group-size", _plan(strategy="group", group_size=True), ValidationError, ("group_size",)),
    ApiCase("api-plan-string-prefetch-step", _plan(backend="prefetch", prefetch_step="2"), ValidationError,
            ("prefetch_step",)),
    ApiCase("api-spec-ten-million-layers", _validate({"model": {"name": "m", "dtype": "bf16", "layers": [_ONE_LAYER]}}),
            ValidationError, ("expands to 10,000,000 layers",)),
    ApiCase("api-parse-size-exponent", _parse("1e-3"), ValidationError, ("no exponents",)),
    ApiCase("api-parse-size-none", _parse(None), ValidationError, ("(got None: a NoneType, not a size)",)),
    ApiCase("api-load-huge-int", _load(edit("repeat: 4", f"repeat: {HUGE_DIGITS}")), InputError,
            ("s.yaml:9:", "a number of more than 100 digits")),
]

CASES: list[CliCase | ApiCase] = [*CLI_SIZES, *FILE_SIZES, *CAPS, *STRICT_TYPES, *NAMES, *TIES, *API]
