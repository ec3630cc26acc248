"""Bad tensor-parallel input: shards that do not split, bad shard and tp values, --tp with nowhere to write
the rank plans, and rank folders that are not one whole set."""

from __future__ import annotations

import os
from pathlib import Path

from cli_samples import TINY_SPEC

from corpus.case import ApiCase, CliCase
from schemas.errors import InputError


def edit(old: str, new: str) -> str:
    """TINY_SPEC with one edit (the edit must apply, so a case never tests the good spec by mistake)."""
    assert old in TINY_SPEC, old
    return TINY_SPEC.replace(old, new, 1)


GOOD = {"good.yaml": TINY_SPEC}


def plan_tp(id: str, text: str, tp: str, *expect: str, extra: tuple[str, ...] = ()) -> CliCase:
    return CliCase(id, ("plan", "{f}", "--tp", tp, "-g", "1MB", "-o", "{d}/out", *extra), {"bad.yaml": text},
                   expect=expect)


def _tiny():
    from schemas.io import load_model
    from schemas.spec import SpecFile

    return load_model(SpecFile, "tiny.yaml", TINY_SPEC)


def _write_set(folder: Path, tp: int, name: str = "tiny") -> None:
    import planner
    from schemas.io import load_model
    from schemas.spec import SpecFile

    spec = load_model(SpecFile, "s.yaml", TINY_SPEC.replace("name: tiny", f"name: {name}"))
    planner.write_rank_plans(planner.plan_ranks(spec, tp, gpu_budget=10**6), folder)


def _set(tp: int, then=None):
    def setup(d: Path) -> None:
        _write_set(d / "set", tp)
        if then is not None:
            then(d / "set")
    return setup


def _drop(name: str):
    return lambda folder: (folder / name).unlink()


def _copy_as(src: str, dst: str):
    return lambda folder: (folder / dst).write_text((folder / src).read_text())


def _single_plan_as_rank(folder: Path) -> None:
    import planner
    from schemas.io import dump_model

    (folder / "rank1.plan.yaml").write_text(dump_model(planner.plan(_tiny(), gpu_budget=10**6)))


def _other_model_rank1(folder: Path) -> None:
    _write_set(folder.parent / "other", 2, "other")
    (folder.parent / "other" / "rank1.plan.yaml").replace(folder / "rank1.plan.yaml")


SPLITS = [
    plan_tp("tp-uneven-explicit-shard", edit("mlp.w1: [32, 8]", "mlp.w1: {shape: [32, 8], shard: dim0}"), "3",
            "bad.yaml:11:", "params['mlp.w1'].shard", "splits dim 0 of size 32", "world size 3"),
    plan_tp("tp-uneven-default-rule", edit("mlp.w1: [32, 8]", "mlp.gate_proj.weight: [30, 8]"), "4",
            "bad.yaml:11:", "mlp.gate_proj.weight", "the default for MLP gate/up", "size 30",
            "give it shard: replicated"),
    plan_tp("tp-shard-dim1-of-a-vector", edit("norm.weight: [8]", "norm.weight: {shape: [8], shard: dim1}"), "2",
            "bad.yaml:13:", "splits dim 1, but norm.weight has 1 dim(s)"),
    plan_tp("tp-shard-of-a-scalar", edit("norm.weight: [8]", "norm.weight: {shape: [], shard: dim0}"), "2",
            "has 0 dim(s) (shape [])"),
    plan_tp("tp-split-strided-param", edit("mlp.w1: [32, 8]", "mlp.w1: {shape: [32, 8], stride: [1, 32], "
                                            "shard: dim0}"), "2", "stride [1, 32]", "not contiguous"),
    plan_tp("tp-uneven-vocab", edit("weight: [100, 8]", "weight: {shape: [100, 8], shard: vocab}"), "8",
            "bad.yaml:7:", "size 100", "world size 8"),
]

VALUES = [
    CliCase("tp-shard-misspelled", ("validate", "{f}"),
            {"bad.yaml": edit("mlp.w1: [32, 8]", "mlp.w1: {shape: [32, 8], shard: dim_0}")},
            expect=("bad.yaml:11:", "shard", "(got 'dim_0')", "did you mean 'dim0'?")),
    CliCase("tp-shard-rows", ("plan", "{f}", "--tp", "2", "-o", "{d}/out"),
            {"bad.yaml": edit("mlp.w2: [8, 32]", "mlp.w2: {shape: [8, 32], shard: rows}")},
            expect=("bad.yaml:12:", "'replicated'", "'experts'", "(got 'rows')")),
    CliCase("tp-shard-a-number", ("validate", "{f}"),
            {"bad.yaml": edit("mlp.w2: [8, 32]", "mlp.w2: {shape: [8, 32], shard: 1}")},
            expect=("bad.yaml:12:", "(got 1)")),
    CliCase("tp-zero", ("plan", "{f}", "--tp", "0", "-o", "{d}/out"), GOOD | {"bad.yaml": TINY_SPEC},
            expect=("--tp", "greater than or equal to 1")),
    CliCase("tp-not-a-number", ("plan", "{f}", "--tp", "two", "-o", "{d}/out"), {"bad.yaml": TINY_SPEC},
            expect=("--tp", "valid integer")),
    CliCase("tp-spec-zero", ("plan", "{f}", "-o", "{d}/out"), {"bad.yaml": TINY_SPEC + "parallel: {tp: 0}\n"},
            expect=("bad.yaml:23:", "parallel.tp", "must be > 0")),
    CliCase("tp-spec-string", ("validate", "{f}"), {"bad.yaml": TINY_SPEC + "parallel:\n  tp: '2'\n"},
            expect=("bad.yaml:24:", "parallel.tp", "expected a whole number")),
    CliCase("tp-spec-unknown-key", ("validate", "{f}"), {"bad.yaml": TINY_SPEC + "parallel:\n  tensor: 2\n"},
            expect=("bad.yaml:24:", "parallel.tensor", "unknown key", "tp")),
]

OUTPUTS = [
    CliCase("tp-output-is-a-file", ("plan", "{f}", "--tp", "2", "-o", "{d}/good.yaml"), GOOD | {"bad.yaml": TINY_SPEC},
            expect=("good.yaml: not a folder", "rank1.plan.yaml")),
    CliCase("tp-output-looks-like-a-file", ("plan", "{f}", "--tp", "2", "-o", "{d}/llama.plan.yaml"),
            {"bad.yaml": TINY_SPEC}, expect=("llama.plan.yaml: looks like a file name",)),
    CliCase("tp-output-stdout", ("plan", "{f}", "--tp", "2", "-o", "-"), {"bad.yaml": TINY_SPEC},
            expect=("-o - gives none", "give -o FOLDER")),
    CliCase("tp-output-missing", ("plan", "{f}", "--tp", "2"), {"bad.yaml": TINY_SPEC},
            expect=("no -o gives none",)),
    CliCase("tp-from-spec-output-missing", ("plan", "{f}"), {"bad.yaml": TINY_SPEC + "parallel: {tp: 4}\n"},
            expect=("parallel.tp: 4 (", "bad.yaml) writes one plan per rank",)),
    CliCase("tp-with-check", ("plan", "{f}", "--tp", "2", "--check", "{d}/good.yaml"),
            GOOD | {"bad.yaml": TINY_SPEC}, expect=("good.yaml: with --tp 2 this is the folder of the committed rank "
                                                    "plans", "not a folder")),
    CliCase("tp-check-folder-without-plans", ("plan", "{f}", "--tp", "2", "--check", "{d}"),
            {"bad.yaml": TINY_SPEC}, expect=("no rank plans (rank0.plan.yaml, rank1.plan.yaml, ...) in this folder",
                                             "--tp 2 -o ")),
    CliCase("tp-output-under-a-file", ("plan", "{f}", "--tp", "2", "-g", "1MB", "-o", "{d}/good.yaml/set"),
            GOOD | {"bad.yaml": TINY_SPEC}, expect=("good.yaml/set",)),
    CliCase("tp-infeasible-per-gpu", ("plan", "{f}", "--tp", "2", "-g", "100", "--backend", "none", "-o", "{d}/out"),
            {"bad.yaml": TINY_SPEC}, exit=1, expect=("tensor parallel over 2 ranks", "smallest feasible")),
    plan_tp("tp-with-from-vllm", TINY_SPEC, "2", "--from-vllm with --tp",
            extra=("--from-vllm", "--offload-group-size 2 --offload-num-in-group 1")),
]

def _in_the_way(make):
    """A 2-rank set in {d}/set whose rank1.plan.yaml is replaced by ``make(path)`` (a folder, a pipe, ...)."""
    def then(folder: Path) -> None:
        (folder / "rank1.plan.yaml").unlink()
        make(folder / "rank1.plan.yaml")
    return _set(2, then)


def _rewrite(id: str, make, *expect: str) -> CliCase:
    return CliCase(id, ("plan", "{f}", "--tp", "2", "-g", "2MB", "-o", "{d}/set/"), {"bad.yaml": TINY_SPEC},
                   setup=_in_the_way(make), expect=(*expect, "nothing of the set was written"))


REWRITES = [  # the old set stays as it was (tests/test_output_set.py checks the disk after each)
    _rewrite("tp-rewrite-rank-is-a-folder", Path.mkdir, "set/rank1.plan.yaml: cannot write: Is a directory"),
    _rewrite("tp-rewrite-rank-is-a-pipe", os.mkfifo, "set/rank1.plan.yaml: cannot write", "a pipe or a device"),
    _rewrite("tp-rewrite-rank-links-nowhere", lambda p: p.symlink_to(p.parent / "gone" / "r1.yaml"),
             "set/rank1.plan.yaml: cannot write", "does not exist"),
]


FOLDERS = [
    CliCase("tp-show-empty-folder", ("show", "{d}/set"), setup=lambda d: (d / "set").mkdir(),
            expect=("no rank plans",)),
    CliCase("tp-show-missing-rank", ("show", "{d}/set"), setup=_set(4, _drop("rank1.plan.yaml")),
            expect=("rank 1 is missing",)),
    CliCase("tp-show-fewer-ranks-than-world", ("show", "{d}/set"),
            setup=_set(4, lambda f: [_drop("rank2.plan.yaml")(f), _drop("rank3.plan.yaml")(f)]),
            expect=("the plans are for 4 ranks but only rank0.plan.yaml, rank1.plan.yaml are here",
                    "rank2.plan.yaml, rank3.plan.yaml missing")),
    CliCase("tp-show-two-files-one-rank", ("show", "{d}/set"),
            setup=_set(2, _copy_as("rank0.plan.yaml", "rank0.plan.json")), expect=("rank 0 has two plans",)),
    CliCase("tp-show-rank-file-renamed", ("show", "{d}/set"),
            setup=_set(2, lambda f: [(f / "rank0.plan.yaml").replace(f / "rank2.plan.yaml"),
                                     _copy_as("rank1.plan.yaml", "rank0.plan.yaml")(f)]),
            expect=("summary.rank is 1, but it is in rank 0's place",)),
    CliCase("tp-show-single-plan-in-set", ("show", "{d}/set"), setup=_set(2, _single_plan_as_rank),
            expect=("rank1.plan.yaml: not a rank plan",)),
    CliCase("tp-show-other-model", ("show", "{d}/set"), setup=_set(2, _other_model_rank1),
            expect=("made from another spec", "model other")),
    CliCase("tp-show-chart", ("show", "{d}/set", "--chart", "{d}/c.png"), setup=_set(2),
            expect=("--chart draws one plan", "rank0.plan.yaml")),
    CliCase("tp-diff-folder-and-file", ("diff", "{d}/set", "{d}/set/rank0.plan.yaml"), setup=_set(2),
            expect=("is a folder of rank plans but", "is not")),
    CliCase("tp-show-bad-rank-file", ("show", "{d}/set"),
            setup=_set(2, lambda f: (f / "rank1.plan.yaml").write_text("plan_version: 2\nsummary: {}\n")),
            expect=("rank1.plan.yaml:",)),
]


def _write_into_file(d: Path) -> object:
    import planner

    (d / "f").write_text("x")
    return planner.write_rank_plans(planner.plan_ranks(_tiny(), 2, gpu_budget=10**6), d / "f")


def _kept_file(d: Path) -> None:
    assert (d / "f").read_text() == "x"


def _world_zero(d: Path) -> object:
    import planner

    return planner.plan_ranks(_tiny(), 0)


API = [
    ApiCase("tp-api-world-zero", _world_zero, InputError, ("world size must be 1 or more",)),
    ApiCase("tp-api-write-into-a-file", _write_into_file, InputError, ("not a folder",), after=_kept_file),
]

CASES = SPLITS + VALUES + OUTPUTS + REWRITES + FOLDERS + API
