"""The plan's notes on its schedule, its spanning layers and its tied params, in words (planner/assemble.py
decides; this module only words what it decided)."""

from __future__ import annotations

from collections.abc import Sequence

from planner.words.names import join_names
from schemas.schedule import Trigger, num_slots
from schemas.spec import Layer


def schedule_notes(names: list[str], triggers: list[Trigger], step: int, run: int, automatic: bool,
                    what: str, once: Sequence[bool] = ()) -> list[str]:
    """``once``: per layer, copied once at apply time (its slot's only user), so never in a forward."""
    kept = set() if not once else {name for name, alone in zip(names, once) if alone}
    names = [name for name, t in zip(names, triggers) if not t.span]
    triggers = [t for t in triggers if not t.span]
    if not names:
        return []
    n, k = len(names), num_slots(len(names), step)
    slots = "one buffer slot" if k == 1 else f"{k} buffer slots"
    default = " (the default: double buffering)" if automatic else ""
    notes = [f"prefetch_step {step}{default}: the {n} {what} layers share {slots}; a layer's copy is "
             f"issued as soon as the previous user of its slot has finished, so it overlaps the compute of the "
             f"layers in between"]
    if k == n:
        fewer = "offload more layers or use UVA" if n == 1 else f"use fewer slots (prefetch_step {n - 1} or less)"
        notes.append(f"warning: {n} {what} layer{'s' if n > 1 else ''} in {slots}: the buffer pool holds every "
                     f"{what} layer at once, so prefetch saves no GPU memory; {fewer}")
    elif run > k:
        inside = "no other layer" if k == 1 else f"only the {'layer' if k == 2 else f'{k - 1} layers'} before it"
        notes.append(f"runs of up to {run} consecutive {what} layers: inside a run a copy overlaps the compute "
                     f"of {inside}, so layers late in a run will stall when a copy takes longer (the predictions "
                     f"give the stall); more slots help only where resident layers come before a run, at the "
                     f"size of the largest {what} layer each")
    wrapped = [name for name, t in zip(names, triggers) if t.previous_forward and name not in kept]
    if wrapped:
        notes.append(f"wrap-around: {join_names(wrapped, 8)} {'starts its' if len(wrapped) == 1 else 'start their'} copy in the "
                     "previous forward; the runtime fills those slots at apply time")
    return notes


def span_notes(layers: Sequence[Layer], positions: list[int], triggers: list[Trigger]) -> list[str]:
    n = len(layers)
    return [f"{layers[p].name} spans the slots: its buffers lie over the slots' bytes (the pool is one arena), so its "
            f"copy starts before {layers[t.copy_before(n)].name} runs, once the layer before it is done, and the "
            f"copies after it wait until it has run" for p, t in zip(positions, triggers) if t.span]


def tied_note(layers: Sequence[Layer]) -> list[str]:
    """Tied params in the order of the layer graph's tie edges (planner/layers.py): per layer, grouped by owner
    layer, the layer right after it first."""
    if not any(layer.tied for layer in layers):
        return []
    owner_layer = {f"{layer.name}.{t.name}": layer.name for layer in layers for t in layer.params}
    pairs = []
    for i, layer in enumerate(layers):
        if not layer.tied:
            continue
        following = layers[i + 1].name if i + 1 < len(layers) else None
        owners: list[str] = []
        for target in layer.tied.values():
            owner = owner_layer[target]
            if owner not in owners:
                owners.append(owner)
        owners.sort(key=lambda o: o != following)  # stable: the edge to the next layer was made first
        for owner in owners:
            pairs += [f"{layer.name}.{rel} shares {target}" for rel, target in layer.tied.items()
                      if owner_layer[target] == owner]
    more = f" and {len(pairs) - 5} more" if len(pairs) > 5 else ""
    return [f"tied params are never offloaded and stay resident, counted once at their owner: "
            f"{'; '.join(pairs[:5])}{more}"]
