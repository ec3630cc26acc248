"""Runtime: execute an offload plan on a PyTorch module (the only package that imports torch)."""

from runtime.apply import Handle, apply
from runtime.describe import describe
from runtime.errors import ApplyError, PlanMismatchError

__all__ = ["ApplyError", "Handle", "PlanMismatchError", "apply", "describe"]
