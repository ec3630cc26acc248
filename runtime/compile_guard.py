"""torch.compile and the offload hooks.

Dynamo does not guard on ``nn.Module`` hooks by default (``torch._dynamo.config.
skip_nnmodule_hook_guards``), so code compiled for one instance of a model class (an
unoffloaded copy used as a reference, say) is reused for an instance that carries offload
hooks: it runs without them and reads slot buffers that hold another layer's weights. The
outputs are silently wrong (measured: bf16 logits off by 3.3 on a prefetch plan). So while any
plan is applied, dynamo guards on hooks, and the previous setting comes back when the last plan
is removed; the compile caches are also dropped at apply and at remove, so code compiled for
this model before ``apply`` (or while it was applied) is never reused for the other state.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("runtime")

_held = 0
_saved: bool | None = None


def hold() -> None:
    """One more applied plan: make dynamo guard on module hooks."""
    global _held, _saved
    import torch._dynamo.config as config

    if _held == 0:
        _saved = config.skip_nnmodule_hook_guards
        config.skip_nnmodule_hook_guards = False
    _held += 1


def release() -> None:
    """One plan fewer: the last one restores dynamo's own setting."""
    global _held
    if _held == 0:
        return
    _held -= 1
    if _held == 0:
        import torch._dynamo.config as config

        config.skip_nnmodule_hook_guards = _saved


def reset_compiled_code() -> None:
    """Drop code compiled before apply() (or remove()): it was traced without (or with) the hooks."""
    if "torch._dynamo" in sys.modules:
        import torch._dynamo

        torch._dynamo.reset()
        log.info("torch.compile caches reset so compiled code sees the offload hooks")
