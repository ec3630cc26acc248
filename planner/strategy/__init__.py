"""Strategies: which params leave the GPU (records only; the words are in ``planner.words``).

``auto`` (order + first fit + slots), ``budget`` (an order spread over the block stack, the shortest
prefix that fits), the group rule (``planner.layers``), and the bytes and peaks they reckon with."""
