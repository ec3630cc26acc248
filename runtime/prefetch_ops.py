"""The prefetch offloader's steps as registered custom ops.

``torch.compile`` treats each op as an opaque call that mutates the activation it is
given (the layer's input for ``start_copies`` and ``wait_copy``, the model's output for
``join``). That data dependency keeps them in program order relative to the layers'
compute, with no graph break; the ops' bodies do the stream work at run time. Under
CUDA graph capture the bodies run once, and their event record/wait calls become the
graph's cross-stream edges.
"""

from __future__ import annotations

import weakref

import torch

# weak: the model's hooks keep its offloader alive, and a model dropped while applied (without
# remove()) must not be kept alive from here
_OFFLOADERS: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()
_next_id = [0]


def register(offloader: object) -> int:
    _next_id[0] += 1
    _OFFLOADERS[_next_id[0]] = offloader
    return _next_id[0]


def unregister(handle_id: int) -> None:
    _OFFLOADERS.pop(handle_id, None)


@torch.library.custom_op("offload_planner::start_copies", mutates_args=("x",))
def start_copies(x: torch.Tensor, handle: int, position: int) -> None:
    """Issue the copies whose trigger is the layer at ``position`` (on the copy stream)."""
    _OFFLOADERS[handle].start_copies(position)


@start_copies.register_fake
def _(x: torch.Tensor, handle: int, position: int) -> None:
    return None


@torch.library.custom_op("offload_planner::wait_copy", mutates_args=("x",))
def wait_copy(x: torch.Tensor, handle: int, layer: int) -> None:
    """Make the compute stream wait until offloaded layer ``layer``'s weights have landed."""
    _OFFLOADERS[handle].wait_copy(layer)


@wait_copy.register_fake
def _(x: torch.Tensor, handle: int, layer: int) -> None:
    return None


@torch.library.custom_op("offload_planner::join", mutates_args=("x",))
def join(x: torch.Tensor, handle: int) -> None:
    """Make the compute stream wait for the copy stream (end of forward)."""
    _OFFLOADERS[handle].join_after_forward()


@join.register_fake
def _(x: torch.Tensor, handle: int) -> None:
    return None
