"""Bad input about what a plan counts besides the weights: a workload's sequences and context (on the command
line and in a spec), the KV cache options, the memory section's overrides; and requests the model cannot
size (a fused projection without its heads)."""

from __future__ import annotations

from cli_samples import TINY_SPEC

from corpus.case import ApiCase, CliCase

PLAN = ("plan", "{f}", "--gpu-budget", "2KB")
LLAMA = "examples/generated/llama-3-8b.yaml"


def _spec(extra: str) -> str:
    return TINY_SPEC + extra


def _cli(id: str, *args: str, text: str = TINY_SPEC, expect: tuple[str, ...], exit: int = 2) -> CliCase:
    return CliCase(id, (*PLAN, *args), files={"bad.yaml": text}, expect=expect, exit=exit)


def _file(id: str, workload: str, *expect: str) -> CliCase:
    return CliCase(id, ("validate", "{f}"), files={"bad.yaml": _spec(f"workload:\n  {workload}\n")}, expect=expect)


def _memory(id: str, line: str, *expect: str) -> CliCase:
    """TINY_SPEC with ``line`` in its memory section (replacing the key it names, when it has it)."""
    key = line.split(":")[0]
    text = TINY_SPEC.replace("  activations: 0\n", "  activations: 0\n  NEW\n")
    text = "".join(part for part in text.splitlines(keepends=True) if not part.startswith(f"  {key}:"))
    return CliCase(id, ("validate", "{f}"), files={"bad.yaml": text.replace("NEW", line)}, expect=expect)


def _fused_qkv_with_context(_tmp) -> object:
    import planner
    from schemas.spec import SpecFile
    from schemas.workload import Workload, WorkloadItem

    spec = SpecFile.model_validate({"model": {"name": "fused", "dtype": "bfloat16", "layers": [
        {"name": "blocks.{i}", "repeat": 2, "params": {"attn.qkv_proj.weight": [96, 32], "mlp.up_proj.weight": [64, 32]}}]}})
    return planner.plan(spec, workload=Workload({"decode": WorkloadItem(batch=2, context=16)}))


CASES = [
    # the command line: -w NAME=N@CONTEXT, NAME=auto@CONTEXT, --context
    _cli("memory-auto-without-context", "-w", "decode=auto", expect=("--workload", "batch auto needs a context")),
    _cli("memory-context-not-a-number", "-w", "decode=4@long", expect=("--workload", "the context must be a whole number",
                                                                         "'long'")),
    _cli("memory-context-zero", "-w", "decode=4@0", expect=("--workload", "from 1 to")),
    _cli("memory-batch-not-a-number", "-w", "decode=x@64", expect=("--workload", "the batch must be a whole number",
                                                                   "or auto")),
    _cli("memory-context-shorter-than-a-prefill", "-w", "prefill=512@64",
         expect=("--workload", "a context of 64 tokens cannot hold the 512 new tokens")),
    _cli("memory-context-option-too-short", "-w", "prefill=512", "--context", "64",
         expect=("--context 64", "cannot hold the 512 new tokens")),
    _cli("memory-context-option-zero", "--context", "0", expect=("--context",)),
    _cli("memory-too-many-cached-tokens", "-w", "decode=1000000000@1000000000",
         expect=("--workload", "more than 1e+12 tokens of KV cache")),
    _cli("memory-objective-without-context", "--objective", "throughput", expect=("--objective throughput",
                                                                                  "has no context")),
    _cli("memory-objective-two-steps", "-w", "decode=2@8", "-w", "chat=2@8", "--objective", "throughput",
         expect=("--objective throughput", "has 2 (decode, chat)")),
    _cli("memory-objective-unknown", "--objective", "latency", expect=("--objective", "latency")),
    _cli("memory-two-auto-batches", "-w", "decode=auto@8", "-w", "chat=auto@8",
         expect=("batch auto is given for decode and chat",)),
    _cli("memory-kv-cache-not-a-size", "--kv-cache", "lots", expect=("--kv-cache", "'lots'", "or auto")),
    _cli("memory-kv-cache-dtype-unknown", "--kv-cache-dtype", "fp7", expect=("--kv-cache-dtype", "unknown dtype 'fp7'")),
    CliCase("memory-kv-cache-auto-without-budget", ("plan", LLAMA, "--kv-cache", "auto"),
            expect=("kv_cache auto", "give a gpu_budget")),
    CliCase("memory-reservation-too-small", ("plan", LLAMA, "-g", "40GB", "--kv-cache", "1GiB", "-w", "decode=32@4096"),
            expect=("memory.kv_cache reserves 1.00 GiB", "less than the KV cache for 32 x 4,096 tokens")),
    CliCase("memory-kv-cache-alone-over-budget", ("plan", LLAMA, "-g", "12GB", "-w", "decode=32@4096"), exit=1,
            expect=("the KV cache for 32 x 4,096 tokens alone needs 16.00 GiB", "the smallest gpu_budget is",
                    "hint: rerun with --gpu-budget")),
    CliCase("memory-logits-over-budget", ("plan", LLAMA, "-g", "8GB", "-w", "prefill=65536"), exit=1,
            expect=("the activations of prefill (65,536 tokens, at lm_head: logits (65536 x 128256))",
                    "alone need 16.16 GiB")),
    # a spec's workload: file, line and field
    _file("memory-file-auto-without-context", "decode: {batch: auto}", "bad.yaml:", "workload.decode.context",
          "batch auto needs a context"),
    _file("memory-file-auto-with-tokens", "decode: {batch: auto, tokens: 4, context: 8}", "workload.decode.tokens",
          "leave tokens out"),
    _file("memory-file-batch-over-tokens", "decode: {batch: 40, tokens: 8}", "workload.decode.batch",
          "40 sequences push at least one token each"),
    _file("memory-file-batch-word", "decode: {batch: many, context: 5}", "workload.decode.batch",
          "a whole number of sequences", "or auto (got 'many')"),
    _file("memory-file-batch-bool", "decode: {batch: true}", "workload.decode.batch", "(got True)"),
    _file("memory-file-neither", "decode: {context: 5}", "workload.decode.tokens", "give tokens"),
    _file("memory-file-context-short", "prefill: {tokens: 2048, context: 10}", "workload.prefill.context",
          "cannot hold the 2048 new tokens"),
    _file("memory-file-logits-word", "decode: {batch: 1, context: 8, logits: first}", "workload.decode.logits",
          "'all' or 'last'"),
    _file("memory-file-context-float", "decode: {batch: 1, context: 8.5}", "workload.decode.context"),
    _file("memory-file-unknown-key", "decode: {batch: 1, contxt: 8}", "workload.decode.contxt", "unknown key",
          "context"),
    # the memory section's overrides
    _memory("memory-file-kv-cache-word", "kv_cache: lots", "bad.yaml:", "memory.kv_cache", "(got 'lots'), or auto"),
    _memory("memory-file-kv-dtype", "kv_cache_dtype: fp7", "memory.kv_cache_dtype", "unknown dtype 'fp7'"),
    _memory("memory-file-kv-per-token-zero", "kv_bytes_per_token: 0", "memory.kv_bytes_per_token", "must be > 0"),
    _memory("memory-file-workspace-negative", "workspace: -1", "memory.workspace", "must be 0 or more"),
    _memory("memory-file-activations-word", "activations: some", "memory.activations", "'some'"),
    # what the spec cannot say
    ApiCase("memory-fused-qkv-needs-heads", _fused_qkv_with_context, Exception,
            ("workload 'decode' keeps a KV cache", "queries, keys and values in one projection",
             "add model.attention: {heads: H, kv_heads: K}", "or give memory.kv_bytes_per_token")),
]
