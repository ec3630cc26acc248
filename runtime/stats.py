"""Per-forward copy statistics, measured with CUDA events (recorded only when stats are on)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ForwardStats:
    bytes: int = 0
    copies: list = field(default_factory=list)  # (start event, end event, bytes) on the copy stream
    stalls: list = field(default_factory=list)  # (before wait, after wait) on the compute stream
    late_copies: int = 0  # layers that found another layer's weights in their slot and copied then

    def summary(self) -> dict:
        copy_ms = sum(a.elapsed_time(b) for a, b, _ in self.copies)
        timed_bytes = sum(n for _, _, n in self.copies)
        stall_ms = sum(a.elapsed_time(b) for a, b in self.stalls)
        return {
            "bytes_copied": self.bytes,
            "copy_ms": round(copy_ms, 4),
            "stall_ms": round(stall_ms, 4),
            "copy_gbps": round(timed_bytes / copy_ms / 1e6, 2) if copy_ms > 0 else None,
            "late_copies": self.late_copies,
        }
