"""The command-line ends of the vLLM bridge: `plan --from-vllm` and `export --to vllm`."""

from __future__ import annotations

from typing import Any

from schemas.errors import InputError

from planner.vllm.flags import OPTION, parse_vllm_flags

# plan options that vLLM's flags decide, so they cannot go with --from-vllm
_DECIDED = {"backend": "--backend", "strategy": "--strategy", "group_size": "--group-size",
            "num_in_group": "--num-in-group", "prefetch_step": "--prefetch-step", "params": "--params",
            "kinds": "--kinds", "prefer": "--prefer", "backends": "--backends"}


def plan_from_vllm(spec: Any, flags_text: str, options: dict[str, Any]) -> Any:
    """`planner plan SPEC --from-vllm FLAGS` with the other plan options (as planner.cli.app collects them)."""
    clash = [flag for key, flag in _DECIDED.items() if options.get(key) is not None]
    if clash:
        raise InputError(f"{OPTION} takes what to offload from vLLM's flags; {', '.join(clash)} cannot go with it "
                         "(give vLLM's own flag inside --from-vllm, e.g. --offload-prefetch-step 2)")
    flags = parse_vllm_flags(flags_text)
    from planner.vllm.plan import from_vllm

    if options.get("kv_cache") == "auto":
        raise InputError(f"{OPTION} with --kv-cache auto: vLLM sizes its own KV cache from what its flags leave; "
                         "give --kv-cache SIZE to count a reservation in the plan")
    memory = {k: options[k] for k in ("kv_cache", "kv_cache_dtype") if options.get(k) is not None}
    if memory:
        spec = spec.model_copy(update={"memory": spec.memory.model_copy(update=memory)})
    return from_vllm(spec, flags, gpu_budget=options.get("gpu_budget"), cpu_budget=options.get("cpu_budget"),
                     hardware=options.get("hardware"), workload=options.get("workload"))
