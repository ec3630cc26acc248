"""Errors raised by the runtime. Each says everything that is wrong at once."""

from __future__ import annotations

from schemas.errors import EXIT_BAD_INPUT, EXIT_NOT_POSSIBLE, PlannerError


class PlanMismatchError(PlannerError, ValueError):
    """The plan does not describe this model (names, shapes, dtypes, ties). Nothing was moved."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problems: list[str], model_name: str = "model") -> None:
        self.problems = problems
        shown = problems[:20]
        more = f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else ""
        body = "\n".join(f"  - {p}" for p in shown)
        super().__init__(
            f"the plan does not match the {model_name} ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}); nothing was moved:\n{body}{more}"
        )


class ApplyError(PlannerError, RuntimeError):
    """apply() could not run (no CUDA, not enough memory, …). The model was left as it was."""

    exit_code = EXIT_NOT_POSSIBLE


class ConcurrentForwardError(ApplyError):
    """A second thread ran a forward of a model whose prefetch plan another thread's forward is using
    (runtime/forward_gate.py). Nothing was changed; the other forward runs on."""


class OffloadedWriteError(PlannerError, RuntimeError):
    """The model wrote to an offloaded tensor: offloaded tensors are read-only while a plan is
    applied (runtime/writes.py). Raised at the end of the forward that found it, instead of its
    output; every later forward raises too, until ``remove()``."""

    exit_code = EXIT_NOT_POSSIBLE

    def __init__(self, written: list[tuple[str, bool, str]]) -> None:
        """``written``: (name, is a buffer, backend: 'prefetch', 'uva' or 'copy') per tensor written."""
        self.written = [name for name, _, _ in written]
        shown = "\n".join(f"  - {name} ({'buffer' if buffer else 'param'}, {_WHERE[how]})"
                          for name, buffer, how in written[:20])
        more = f"\n  … and {len(written) - 20} more" if len(written) > 20 else ""
        super().__init__(
            f"the model wrote to {len(written)} offloaded tensor{'s' if len(written) != 1 else ''} "
            f"during a forward (or between forwards); offloaded tensors are read-only while a plan is "
            f"applied, so this forward's output was not returned:\n{shown}{more}\n"
            f"Tensors the model writes (a KV cache, running statistics) must stay resident: plan again "
            f"with them left out of what may move (the spec's offload.params lists the name segments that "
            f"may be offloaded). handle.remove() puts back the values held in host memory.")


_WHERE = {
    "prefetch": "prefetched: the write went to a buffer slot other layers reuse and is lost; "
                "its host copy holds the value before the write",
    "uva": "read through UVA: the write went to its host copy, which now holds it",
    "copy": "copied in before its layer (UVA fallback): the write is lost",
}


def written_warning(written: list[tuple[str, bool, str]]) -> str:
    """What ``remove()`` says when the model wrote offloaded tensors while applied."""
    names = ", ".join(name for name, _, _ in written[:8]) + (" …" if len(written) > 8 else "")
    kept = [name for name, _, how in written if how == "uva"]
    return (f"the model wrote to {len(written)} offloaded tensor(s) while the plan was applied ({names}); "
            f"offloaded tensors are read-only, and remove() restored the values their host copies hold: "
            + (f"{len(kept)} read through UVA hold the write, " if kept else "")
            + "prefetched or copied ones the values from before the write")
