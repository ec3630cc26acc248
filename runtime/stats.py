"""Per-forward copy statistics, measured with CUDA events (recorded only when stats are on).

Each copy and each wait carries the name of the layer it is for, so ``summary()`` can
say per layer what the copy and the stall took (``schemas.measured`` is the format). On
the CPU there are no CUDA events: copies are recorded with their layer and bytes and
``None`` for the events, and their times come out as ``None`` (not measured).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.measured import MeasuredForward, MeasuredLayer


def _ms(a, b) -> float | None:
    return None if a is None or b is None else a.elapsed_time(b)


def _total(times: list[float | None]) -> float | None:
    timed = [t for t in times if t is not None]
    return round(sum(timed), 4) if timed else None


@dataclass
class ForwardStats:
    bytes: int = 0
    copies: list = field(default_factory=list)  # (layer name, start event, end event, bytes) on the copy stream
    stalls: list = field(default_factory=list)  # (layer name, before wait, after wait) on the compute stream
    late_copies: int = 0  # layers that found another layer's weights in their slot and copied then

    def summary(self) -> dict:
        copies = [(name, _ms(a, b), n) for name, a, b, n in self.copies]
        stalls = [(name, _ms(a, b)) for name, a, b in self.stalls]
        rows: dict[str, dict] = {}
        for name, ms, n in copies:
            row = rows.setdefault(name, {"name": name, "bytes": 0, "copy": [], "stall": []})
            row["bytes"] += n
            row["copy"].append(ms)
        for name, ms in stalls:
            rows.setdefault(name, {"name": name, "bytes": 0, "copy": [], "stall": []})["stall"].append(ms)
        layers = [MeasuredLayer(name=r["name"], bytes=r["bytes"], copy_ms=_total(r["copy"]),
                                stall_ms=_total(r["stall"])) for r in rows.values()]
        copy_ms = _total([ms for _, ms, _ in copies])
        timed_bytes = sum(n for _, ms, n in copies if ms is not None)
        return MeasuredForward(
            bytes_copied=self.bytes,
            copy_ms=copy_ms,
            stall_ms=_total([ms for _, ms in stalls]),
            copy_gbps=round(timed_bytes / copy_ms / 1e6, 2) if copy_ms else None,
            late_copies=self.late_copies,
            layers=layers,
        ).model_dump()
