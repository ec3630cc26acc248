"""Plans made by hand, for tests and bench/gpu_check.py: shapes the strategies do not make on small models."""

from __future__ import annotations

from collections.abc import Iterable

from planner.assemble import assemble
from planner.assemble import Assignment
from schemas import Plan, SpecFile
from schemas.spec_hash import spec_sha256


def span_plan(spec: SpecFile, blocks: Iterable[int], step: int, span: tuple[str, ...]) -> Plan:
    """``model.layers.<i>`` for ``i`` in ``blocks`` prefetched whole on ``step`` slots, and the layers named in
    ``span`` prefetched whole spanning the slots."""
    layers = spec.model.expanded()
    names = {f"model.layers.{i}" for i in blocks} | set(span)
    where = {layer.name: {t.name: "prefetch" for t in layer.params} for layer in layers if layer.name in names}
    return assemble(layers, Assignment(where, step, "budget", "by hand", (), frozenset(span)),
                    model_name=spec.model.name, spec_sha256=spec_sha256(spec))
