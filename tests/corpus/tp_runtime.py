"""Tensor-parallel misuse of ``runtime.apply`` that needs no process group: rank plans handed to a
process that does not know its rank, or is told another one; directories and lists of rank plans
that do not hold this rank's; a malformed ``rank=``. Each leaves the model exactly as it was.
(Refusals against a real DTensor model run in two gloo processes: tests/test_tp_runtime.py.)
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from corpus.case import ApiCase
from corpus.runtime_calls import _apply, _cfg, _refused
from models import make_llama
from tp_model import rank_plans

import runtime
from runtime.errors import ApplyError
from schemas import Plan, dump_model
from schemas.errors import InputError


@lru_cache(maxsize=None)
def _plans() -> tuple[Plan, ...]:
    """Rank plans for 2 ranks of the 3-block model, every param replicated (a plain model's layout)."""
    spec = runtime.describe(make_llama(_cfg(3)))
    return tuple(rank_plans(spec, 2, strategy="group", group_size=2, num_in_group=1, prefetch_step=1,
                            backend="prefetch"))


def _folder(tmp: Path, *ranks: int) -> Path:
    folder = tmp / "plans"
    folder.mkdir(exist_ok=True)
    for r in ranks:
        (folder / f"rank{r}.plan.yaml").write_text(dump_model(_plans()[r]))
    return folder


CASES = [
    _refused("tp-rank-plan-without-a-rank", lambda m, t: _apply(m, _plans()[0]),
             expect=("the plan for rank 0 of 2", "rank is unknown", "pass rank=")),
    _refused("tp-rank-plan-for-another-rank", lambda m, t: _apply(m, _plans()[0], rank=1),
             expect=("the plan for rank 0 of 2 cannot run on rank 1", "rank1.plan.yaml")),
    _refused("tp-directory-without-a-rank", lambda m, t: _apply(m, _folder(t, 0, 1)), error=ApplyError,
             expect=("holds plans for several tensor-parallel ranks", "pass rank=")),
    _refused("tp-directory-without-this-rank", lambda m, t: _apply(m, _folder(t, 0), rank=1), error=InputError,
             expect=("the plans are for 2 ranks but only rank0.plan.yaml is here", "rank1.plan.yaml missing")),
    _refused("tp-list-out-of-order", lambda m, t: _apply(m, list(_plans())[::-1], rank=0),
             expect=("plans[0]: summary.rank is 1, but it is in rank 0's place",)),
    _refused("tp-list-too-short", lambda m, t: _apply(m, list(_plans()), rank=2),
             expect=("no plan for rank 2: the list holds 2",)),
    _refused("tp-rank-as-text", lambda m, t: _apply(m, _plans()[0], rank="0"), error=ApplyError,
             expect=("rank='0'", "whole number")),
    _refused("tp-rank-as-bool", lambda m, t: _apply(m, _plans()[0], rank=True), error=ApplyError,
             expect=("rank=True", "whole number")),
    _refused("tp-process-group-without-distributed", lambda m, t: _apply(m, _plans()[0], process_group=object()),
             error=ApplyError, expect=("process_group=", "not initialized")),
    _refused("tp-list-holding-a-spec", lambda m, t: _apply(m, [_plans()[0], runtime.describe(m)], rank=0),
             error=ApplyError, expect=("a list of rank plans", "got a list")),
]

__all__ = ["CASES", "ApiCase"]
