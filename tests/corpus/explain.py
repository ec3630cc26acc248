"""Bad input to `planner explain` (the STATS.json file and its options) and to `planner show`'s
--chart, --workload and --hardware."""

from __future__ import annotations

import json

from corpus.case import CliCase

import planner
from schemas.io import dump_model
from schemas.spec import SpecFile


def _plan_text() -> tuple[str, str, str]:
    """A small prefetch plan as file text, one prefetched layer and one resident layer."""
    spec = SpecFile.model_validate({"model": {"name": "tiny", "dtype": "float16", "layers": [
        {"name": "embed", "params": {"weight": [100, 8]}},
        {"name": "blocks.{i}", "repeat": 4, "params": {"mlp.w1": [32, 8], "mlp.w2": [8, 32], "norm.weight": [8]}},
        {"name": "head", "params": {"weight": [100, 8]}}]}})
    plan = planner.plan(spec, backend="prefetch", strategy="group", group_size=2, num_in_group=1,
                        gpu_budget=10**9)
    prefetched = next(layer.name for layer in plan.layers if layer.prefetch is not None)
    resident = next(layer.name for layer in plan.layers if not layer.offloaded)
    return dump_model(plan), prefetched, resident


PLAN, PREFETCHED, RESIDENT = _plan_text()


def _stats(**forward: object) -> str:
    row = {"bytes_copied": 1024, "copy_ms": 0.5, "stall_ms": 0.1,
           "layers": [{"name": PREFETCHED, "bytes": 1024, "copy_ms": 0.5, "stall_ms": 0.1}]}
    return json.dumps({"backend": "prefetch", "forwards": [{**row, **forward}]})


def _explain(case_id: str, stats: str | bytes, *expect: str, extra: tuple[str, ...] = ()) -> CliCase:
    return CliCase(case_id, ("explain", "{d}/plan.yaml", "--measured", "{d}/stats.json", *extra),
                   files={"plan.yaml": PLAN, "stats.json": stats}, expect=expect)


def _show(case_id: str, *args: str, expect: tuple[str, ...]) -> CliCase:
    return CliCase(case_id, ("show", "{d}/plan.yaml", *args), files={"plan.yaml": PLAN}, expect=expect)


CASES = [
    CliCase("explain-stats-missing", ("explain", "{d}/plan.yaml", "--measured", "{d}/nope.json"),
            files={"plan.yaml": PLAN}, expect=("nope.json: no such file",)),
    CliCase("explain-no-measured-option", ("explain", "{d}/plan.yaml"), files={"plan.yaml": PLAN},
            expect=("--measured",)),
    _explain("explain-stats-binary", b"\x89PNG\r\n\x1a\n\x00\x00", "stats.json", "not a text file"),
    _explain("explain-stats-empty", "", "stats.json", "the file is empty"),
    _explain("explain-stats-top-level-list", "[1, 2]", "stats.json", "the top level is a list"),
    _explain("explain-stats-truncated-json", _stats()[:-7], "stats.json"),
    _explain("explain-stats-duplicate-key", '{"backend": "prefetch", "backend": "uva", "forwards": []}',
             "stats.json", "backend"),
    _explain("explain-stats-misspelled-top-key", _stats().replace('"forwards"', '"forwrds"'),
             "stats.json", "forwrds", "did you mean 'forwards'"),
    _explain("explain-stats-no-forwards", json.dumps({"backend": "prefetch", "forwards": []}),
             "stats.json", "forwards", "at least 1 item"),
    _explain("explain-stats-forwards-mapping", json.dumps({"backend": "prefetch", "forwards": {"0": {}}}),
             "stats.json", "forwards", "expected a list"),
    _explain("explain-stats-unknown-backend", _stats().replace('"prefetch"', '"cuda"'),
             "stats.json", "backend", "'prefetch'"),
    _explain("explain-stats-missing-bytes-copied", json.dumps({"backend": "prefetch", "forwards": [{}]}),
             "stats.json", "forwards[0].bytes_copied", "required key is missing"),
    _explain("explain-stats-negative-copy", _stats(copy_ms=-1.5), "forwards[0].copy_ms", ">= 0"),
    _explain("explain-stats-negative-step", _stats(step_ms=-3), "forwards[0].step_ms", ">= 0"),
    _explain("explain-stats-time-as-text", _stats(stall_ms="fast"), "forwards[0].stall_ms"),
    _explain("explain-stats-fractional-bytes", _stats(bytes_copied=10.5), "forwards[0].bytes_copied",
             "whole number"),
    _explain("explain-stats-layer-misspelled-key",
             _stats(layers=[{"name": PREFETCHED, "stall_msec": 1.0}]),
             "forwards[0].layers[0].stall_msec", "did you mean 'stall_ms'"),
    _explain("explain-stats-layer-without-name", _stats(layers=[{"bytes": 5}]),
             "forwards[0].layers[0].name", "required key is missing"),
    _explain("explain-stats-layer-empty-name", _stats(layers=[{"name": ""}]),
             "forwards[0].layers[0].name", "must not be empty"),
    _explain("explain-stats-layer-not-in-plan", _stats(layers=[{"name": "blocks.9"}]),
             "forwards[0].layers[0].name", "'blocks.9' is not in the plan", "another plan or model"),
    _explain("explain-stats-layer-not-prefetched", _stats(layers=[{"name": RESIDENT}]),
             "forwards[0].layers[0].name", "is not prefetched in the plan"),
    _explain("explain-stats-other-backend", _stats().replace('"prefetch"', '"uva"'),
             "stats.json: backend", "'uva' run", "plan's backend is 'prefetch'"),
    _explain("explain-stats-is-a-plan", PLAN, "stats.json", "unknown key"),
    _explain("explain-bad-workload", _stats(), "--workload", "tokens must be a whole number",
             extra=("--workload", "decode=0")),
    _explain("explain-unknown-hardware", _stats(), "--hardware", "did you mean 'h200'",
             extra=("--hardware", "h20")),
    _show("show-chart-jpg", "--chart", "{d}/chart.jpg", expect=("--chart", "'.jpg'", ".png, .svg, .pdf")),
    _show("show-chart-no-suffix", "--chart", "{d}/chart", expect=("no suffix", ".png, .svg, .pdf")),
    _show("show-chart-missing-folder", "--chart", "{d}/no/such/chart.png", expect=("no/such",)),
    _show("show-workload-nameless", "--workload", "=512", expect=("--workload", "NAME[=TOKENS|=auto][@CONTEXT]")),
    _show("show-workload-unknown-name", "--workload", "prefil", expect=("did you mean", "the plan predicts: decode")),
    _show("show-hardware-missing-file", "--hardware", "{d}/gpu.yaml", expect=("gpu.yaml: no such file",)),
]
