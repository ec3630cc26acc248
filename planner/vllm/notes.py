"""The words of `plan --from-vllm` (planner/vllm/plan.py decides): the plan's backend_reason and the notes
that say which vLLM rule chose what, and how this plan's buffer pool differs from vLLM's."""

from __future__ import annotations

from schemas.sizes import format_bytes

from planner.words.names import join_names
from planner.vllm.flags import VllmFlags
from planner.vllm.select import VLLM_READ, Selection


def runtime_note(slots: int, pool_bytes: int, once: list[str]) -> str:
    one = len(once) == 1
    alone = (f"; {join_names(once)}, alone in {'its slot' if one else 'their slots'}, {'is' if one else 'are'} "
             f"copied once at start-up and never again (earlier vLLM copied {'it' if one else 'them'} again every "
             "forward)") if once else ""
    return (f"as vLLM's prefetch offloader runs (read at {VLLM_READ}): its pool holds a buffer for every param "
            f"key in each of the {slots} slot{'s' * (slots != 1)}, {format_bytes(pool_bytes)}, counted in the "
            f"peak{alone}")


def plan_words(flags: VllmFlags, chosen: Selection, stack_len: int) -> tuple[str, list[str]]:
    """The plan's backend_reason and first notes (decision in, sentences out)."""
    given = " ".join(flags.given) or "(no flags)"
    head = f"from vLLM flags: {given}"
    layers = join_names(chosen.chosen)
    if chosen.mode == "none":
        return (f"{head}: vLLM offloads nothing with these flags",
                [f"{head}; vLLM's offload backend: none (no --offload-group-size or --cpu-offload-gb above 0)"])
    if chosen.mode == "prefetch":
        g, k, s = flags.group_size, flags.num_in_group, flags.prefetch_step
        params = ("every param" if not flags.offload_params else
                  f"the params matching {', '.join(flags.offload_params)}")
        notes = [f"{head}; vLLM's prefetch offloader: the last {k} of every {g} of the {stack_len} decoder layers, "
                 f"{params}: {len(chosen.chosen)} layers ({layers or 'none'}), {s} buffer slot{'s' * (s != 1)}"]
        skipped = [n for n in chosen.candidates if n not in chosen.chosen]
        if skipped:
            notes.append(f"vLLM skips {join_names(skipped)}: picked by the group rule, no param matches "
                         "--offload-params")
        n = len(chosen.chosen)
        if n > s > 1 and n % s:
            notes.append(f"{n} offloaded layers in {s} slots: vLLM before its slot-ownership fix "
                         f"(vllm-project/vllm#54975) started layer (j+{s}) mod {n}'s copy after layer j, which for "
                         "the first layers of a forward could overwrite a slot whose layer had not run yet; this plan, "
                         "as vLLM since, starts each copy after the previous user of its slot")
        return f"{head}: vLLM's prefetch backend (--offload-group-size above 0)", notes
    limit = flags.uva_max_bytes
    params = "" if not flags.cpu_offload_params else f" matching {', '.join(flags.cpu_offload_params)}"
    notes = [f"{head}; vLLM's UVA offloader: params{params} in layer order from the first decoder layer until "
             f"{format_bytes(limit)} ({limit} bytes) are offloaded, the last one whole: "
             f"{format_bytes(chosen.offloaded_bytes)} in {len(chosen.chosen)} layers ({layers or 'none'})"]
    if chosen.offloaded_bytes < limit:
        notes.append(f"every eligible decoder-layer param is offloaded and the {format_bytes(limit)} are not "
                     "reached: vLLM offloads nothing outside the decoder layers")
    return f"{head}: vLLM's UVA backend (--cpu-offload-gb above 0)", notes


def order_unknown(flags: VllmFlags, layer: str, taken: int, eligible: int, before: str | None, after: str) -> str:
    """Why --cpu-offload-gb is refused on a spec whose params are sorted by name."""
    given = " ".join(flags.given)
    ends = (f"--cpu-offload-gb {before} (up to the layer before it) or {after} (through it)" if before is not None
            else f"--cpu-offload-gb {after} (through it)")
    return (f"--from-vllm '{given}': the limit falls inside {layer} ({format_bytes(taken)} of its "
            f"{format_bytes(eligible)}), and which of its params vLLM offloads depends on the order the module "
            "registers them (vLLM walks named_parameters()); this spec lists each layer's params by name "
            "(model.param_order: name, as --from-safetensors writes: a checkpoint does not keep the module's order). "
            "Make the spec with --from-hf-config or runtime.describe() (registration order), or give a limit that "
            f"ends at a layer: {ends}")
