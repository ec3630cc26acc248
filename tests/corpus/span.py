"""Plan files with a layer spanning the slots, edited by hand: refused with the field named (exit 2).

Every case starts from a valid plan (six blocks prefetched on two slots, the untied head spanning
them) and changes one thing a person editing the file might change.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from corpus.case import CliCase
from schemas import SpecFile
from schemas.io import parse_text
from schemas.yaml_write import dump_yaml

SPEC_TEXT = """\
model:
  name: tiny-span
  dtype: float16
  layers:
    - name: embed
      params: {weight: [64, 8]}
    - name: blocks.{i}
      repeat: 6
      params: {attn.qkv: [24, 8], mlp.w1: [16, 8], mlp.w2: [8, 16]}
    - name: head
      params: {weight: [128, 8]}
"""


@cache
def _plan_json() -> str:
    from planner.assemble import assemble
    from planner.assemble import Assignment
    from schemas.io import plan_data
    from schemas.spec_hash import spec_sha256

    spec = SpecFile.model_validate(parse_text(SPEC_TEXT, "spec"))
    layers = spec.model.expanded()
    where = {layer.name: {t.name: "prefetch" for t in layer.params} for layer in layers if layer.name != "embed"}
    plan = assemble(layers, Assignment(where, 2, "budget", "by hand", (), frozenset({"head"})),
                    model_name="tiny-span", spec_sha256=spec_sha256(spec))
    return json.dumps(plan_data(plan))


def _case(id: str, edit: Callable[[dict[str, Any]], None], expect: tuple[str, ...], command: str = "validate"
          ) -> CliCase:
    def setup(d: Path) -> None:
        data = json.loads(_plan_json())
        edit(data)
        (d / "bad.yaml").write_text(dump_yaml(data))

    return CliCase(id=id, args=(command, "{d}/bad.yaml"), setup=setup, exit=2, expect=("bad.yaml", *expect))


def _head(data: dict[str, Any]) -> dict[str, Any]:
    return data["layers"][-1]["prefetch"]


def _span_key(data: dict[str, Any]) -> dict[str, Any]:
    return next(k for k in data["buffer_pool"]["keys"] if k.get("span"))


def _both(data):
    _head(data)["slot"] = 0


def _neither(data):
    _head(data).pop("span")


def _span_text(data):
    _head(data)["span"] = "yes"


def _as_slot(data):
    _head(data).pop("span")
    _head(data)["slot"] = 0


def _key_flag(data):
    _span_key(data).pop("span")


def _sum_bytes(data):
    keys = data["buffer_pool"]["keys"]
    data["buffer_pool"]["bytes"] = sum(k["bytes"] * (len(k["slots"]) + bool(k.get("span"))) for k in keys)


def _early_copy(data):
    _head(data)["copy_before"] = "blocks.3"  # while blocks.4 and blocks.5 still need the slots' bytes


def _span_on_a_block(data):
    block = data["layers"][3]["prefetch"]
    block.pop("slot")
    block["span"] = True


CASES = [
    _case("span-and-slot-both", _both, ("layers[7].prefetch", "exactly one of them")),
    _case("span-and-slot-neither", _neither, ("layers[7].prefetch", "exactly one of them")),
    _case("span-not-a-bool", _span_text, ("layers[7].prefetch.span",)),
    _case("span-edited-into-a-slot", _as_slot, ("buffer_pool", "from the slots of the offloaded layers holding weight")),
    _case("span-key-flag-dropped", _key_flag, ("buffer_pool.keys", "span: False in the file, True from the spanning layers")),
    _case("span-pool-bytes-as-a-sum", _sum_bytes, ("buffer_pool.bytes", "from the arena"), command="show"),
    _case("span-copy-too-early", _early_copy, ("layers[7].prefetch.copy_before: 'blocks.3' in the file, 'head' from the schedule", "1 of them spanning the slots")),
    _case("span-on-a-block-by-hand", _span_on_a_block, ("layers[3].prefetch", "buffer_pool")),
]
