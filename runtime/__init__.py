"""Runtime: execute an offload plan on a PyTorch module (the only package that imports torch)."""

from runtime.apply import Handle, apply
from runtime.describe import describe
from runtime.errors import ApplyError, ConcurrentForwardError, OffloadedWriteError, PlanMismatchError
from runtime.guard import AppliedModelError, handle_of
from runtime.teardown import RemoveError

__all__ = ["AppliedModelError", "ApplyError", "ConcurrentForwardError", "Handle", "OffloadedWriteError",
           "PlanMismatchError", "RemoveError", "apply", "describe", "handle_of"]
