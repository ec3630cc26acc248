"""Input files over the size cap (schemas/input_file.py), for every command that reads a file: exit 2
with the file's name and the cap, before the file is read. The big files are sparse (a size, no
data), so each case costs nothing; streams (/dev/zero, a FIFO, stdin) are in tests/test_input_file.py."""

from __future__ import annotations

from pathlib import Path

from corpus.case import ApiCase, CliCase
from corpus.lockfile import SPEC, committed_plan
from schemas.errors import InputError
from schemas.input_file import MAX_INPUT_BYTES

BIG = "big.yaml"
CAP = "512.00 MiB"


def _sparse(name: str):
    def setup(d: Path) -> None:
        with open(d / name, "wb") as f:
            f.truncate(MAX_INPUT_BYTES + 1)
        (d / "plan.yaml").write_text(committed_plan())
    return setup


def _case(id: str, *args: str, big: str = BIG) -> CliCase:
    return CliCase(id=f"input-size-{id}", args=args, files={"spec.yaml": SPEC}, setup=_sparse(big),
                   expect=(f"{big}: 512.00 MiB, more than the {CAP} an input file may take", "Limits"))


def _load_big_plan(d: Path) -> object:
    from schemas import load_plan

    _sparse(BIG)(d)
    return load_plan(d / BIG)


CASES = [
    _case("plan-spec", "plan", "{d}/big.yaml"),
    _case("validate", "validate", "{d}/big.yaml"),
    _case("show", "show", "{d}/big.yaml"),
    _case("diff", "diff", "{d}/plan.yaml", "{d}/big.yaml"),
    _case("export", "export", "{d}/big.yaml", "--to", "vllm"),
    _case("explain-plan", "explain", "{d}/big.yaml", "--measured", "{d}/plan.yaml"),
    _case("explain-measured", "explain", "{d}/plan.yaml", "--measured", "{d}/big.yaml"),
    _case("plan-check", "plan", "{d}/spec.yaml", "--check", "{d}/big.yaml"),
    _case("plan-hardware", "plan", "{d}/spec.yaml", "--hardware", "{d}/big.yaml"),
    _case("check-plans-manifest", "check-plans", "--manifest", "{d}/big.yaml"),
    _case("spec-hf-config", "spec", "--from-hf-config", "{d}/config.json", big="config.json"),
    _case("spec-safetensors-index", "spec", "--from-safetensors", "{d}/model.safetensors.index.json",
          big="model.safetensors.index.json"),
    ApiCase("input-size-load-plan", _load_big_plan, InputError, expect=(f"more than the {CAP} an input file may take",)),
]
