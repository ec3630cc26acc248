"""Mixed offloader: per param, prefetched into the buffer pool or read in place through UVA.

The plan's ``uva`` lists say which offloaded params GPU kernels read from pinned host memory;
every other offloaded param is prefetched. This is the prefetch offloader (pool, copy stream,
events and custom ops, over the prefetched params of the layers with a prefetch entry) that
also points the UVA params at device views of their host copies.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.prefetch import PrefetchOffloader
from runtime.uva import read_in_place


@dataclass(eq=False)
class MixedOffloader(PrefetchOffloader):
    name = "mixed"

    def post_init(self) -> None:
        read_in_place(self, self.uva_pairs())
        super().post_init()
