"""The GPU memory a plan counts besides the weights, from the spec alone (no torch): the KV cache
(``kv``), the activations' peak of each forward (``activations``), and the parts as the plan records them
with the budget the strategies get for weights and buffers (``parts``); the batch chosen for the most
tokens per second (``throughput``). ``shapes`` reads what each layer computes from its params' shapes.

A room of its own rather than a file of ``planner/cost`` (which is about time): five concepts that read
the same shapes, and that ``build.py`` uses at one point, the budget it gives the strategies.
"""
