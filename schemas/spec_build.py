"""Building a spec from a flat list of layers found in a model or a checkpoint.

``describe(model)`` (runtime) and the checkpoint readers (planner/sources) both end
here: they list every layer with its tensors in execution order, and ``build_spec``
picks the model's default dtype, drops per-param dtypes equal to it and folds runs of
identical blocks ``prefix.0 … prefix.N-1`` into one ``prefix.{i}`` template.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.numbered import NUMBERED as _BLOCK
from schemas.spec import SpecFile
from schemas.spec_layers import REPEAT_TOKEN, storage_elements


@dataclass
class LayerEntry:
    """One layer: ``params`` maps a name relative to the layer to ``{shape, dtype[, stride][, buffer]}``;
    ``tied`` maps a relative name to the full name of the tensor whose storage it shares."""

    name: str
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)
    moe: dict[str, int] | None = None  # {experts, top_k} of a mixture-of-experts layer


def default_dtype(entries: list[LayerEntry]) -> str:
    """The dtype holding the most elements (ties: the first seen)."""
    counts: dict[str, int] = {}
    for entry in entries:
        for p in entry.params.values():
            counts[p["dtype"]] = counts.get(p["dtype"], 0) + storage_elements(
                tuple(p["shape"]), tuple(p["stride"]) if p.get("stride") else None)
    if not counts:
        raise ValueError("no tensors to describe")
    return max(counts, key=lambda d: counts[d])


def build_spec(name: str, entries: list[LayerEntry], dtype: str | None = None,
               fold: bool = True, param_order: str | None = None,
               attention: dict[str, int] | None = None) -> SpecFile:
    """A validated spec of ``entries`` (execution order), identical consecutive blocks folded; ``param_order``:
    the spec's ``model.param_order`` (None: the params are in registration order, the default); ``attention``:
    the model's ``{heads, kv_heads}`` when known (model.attention)."""
    if not entries:
        raise ValueError("no layers with tensors to describe")
    default = dtype or default_dtype(entries)
    layers = []
    for e in entries:
        params = {rel: {k: v for k, v in p.items() if not (k == "dtype" and v == default)}
                  for rel, p in e.params.items()}
        layers.append({"name": e.name, "params": params, "tied": dict(e.tied), "moe": e.moe})
    spec_layers = fold_blocks(layers) if fold else [_plain(layer) for layer in layers]
    model: dict[str, Any] = {"name": name, "dtype": default, "layers": spec_layers}
    if param_order is not None:
        model["param_order"] = param_order
    if attention:
        model["attention"] = attention
    return SpecFile.model_validate({"model": model})


def _plain(layer: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": layer["name"], "params": layer["params"]}
    if layer["tied"]:
        out["tied"] = layer["tied"]
    if layer.get("moe"):
        out["moe"] = layer["moe"]
    return out


def _template_tied(tied: dict[str, str], block: str, prefix: str) -> dict[str, str]:
    """Tied targets inside the block's own stack member become ``prefix.{i}.…``; others stay."""
    out = {}
    for rel, target in tied.items():
        if target.startswith(block + "."):
            target = f"{prefix}.{REPEAT_TOKEN}.{target[len(block) + 1:]}"
        out[rel] = target
    return out


def fold_blocks(layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold runs of ``prefix.K … prefix.K+N-1`` with identical params and ties into one ``{i}``
    template (``start: K`` when K > 0); blocks that differ (a dense first layer before MoE
    layers, say) stay listed one by one.
    """
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(layers):
        m = _BLOCK.match(layers[i]["name"])
        j = i + 1
        if m:
            prefix, first = m.group(1), int(m.group(2))
            tied0 = _template_tied(layers[i]["tied"], layers[i]["name"], prefix)
            while j < len(layers):
                mj = _BLOCK.match(layers[j]["name"])
                if not (mj and mj.group(1) == prefix and int(mj.group(2)) == first + j - i
                        and layers[j]["params"] == layers[i]["params"]
                        and layers[j].get("moe") == layers[i].get("moe")
                        and _template_tied(layers[j]["tied"], layers[j]["name"], prefix) == tied0):
                    break
                j += 1
            if j - i > 1:
                entry: dict[str, Any] = {"name": f"{prefix}.{REPEAT_TOKEN}", "repeat": j - i}
                if first:
                    entry["start"] = first
                entry["params"] = layers[i]["params"]
                if tied0:
                    entry["tied"] = tied0
                if layers[i].get("moe"):
                    entry["moe"] = layers[i]["moe"]
                out.append(entry)
                i = j
                continue
        out.append(_plain(layers[i]))
        i += 1
    return out
