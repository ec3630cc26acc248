"""Orders in which to take n of M evenly spaced items so that every prefix is spread evenly.

A fixed priority order (never recomputed from n) is what makes a plan stable as the budget
grows: a larger budget takes a shorter prefix of the same order, so every layer it offloads is
offloaded at the smaller budget too.
"""

from __future__ import annotations

from functools import lru_cache


def van_der_corput(n: int) -> list[int]:
    """0..n-1 ordered by bit-reversed rank: every power-of-two prefix is exactly evenly spaced."""
    return list(_van_der_corput(n))


@lru_cache(maxsize=64)  # a search asks for the same few lengths again and again
def _van_der_corput(n: int) -> tuple[int, ...]:
    bits = max(1, (n - 1).bit_length())
    return tuple(sorted(range(n), key=lambda i: (int(f"{i:0{bits}b}"[::-1], 2), i)))


def last_first(n: int) -> list[int]:
    """``van_der_corput`` mirrored: the last item first, then the rest spread evenly before it."""
    return [n - 1 - i for i in van_der_corput(n)]
