"""Strategies: which params leave the GPU (records only; the words are in ``planner.words``).

One machinery for all of them: an order of moves (``order``) fed to one prefix fit (``fit``) with one peak
reckoning (``peaks``); ``infeasible`` is the record of no fit. ``budget`` (a ladder spread over the block
stack), ``group`` (vLLM's group rule), ``auto`` (moves by predicted cost, ``auto_order``, on a slot path,
``auto_slots``); ``choice`` is what budget and group decide."""
