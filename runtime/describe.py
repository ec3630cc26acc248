"""``describe(model)``: a spec from any ``nn.Module``, meta-device models included.

Layers are found from the module tree in registration order (for the usual models the
execution order): each element of a ``ModuleList``/``ModuleDict``/``Sequential`` is a
layer (the block stack), a module that holds tensors directly is a layer, and other
modules are descended into. Every param and persistent buffer is listed with its shape
and dtype (buffers with ``buffer: true``, non-contiguous tensors with their strides).
Non-persistent buffers (rotary ``inv_freq`` tables, causal masks) are left out unless
``non_persistent=True``: they are not in checkpoints, are recomputed rather than loaded,
and ``apply`` moves every tensor the plan does not name to the device anyway. Listing
them would also put buffer-only modules such as ``model.rotary_emb`` into the layer order
at their registration place, which is not where they run.

Tensors that are views of one storage (the same object under two names, a weight and its
transpose, a slice of a bigger param: runtime/ties.py) are listed once, at the first of them
whose bytes cover all the others', and the others are recorded as ``tied`` to it, so their bytes
count once. Views of one storage that no one of them covers (two halves of a fused weight, each a
param) are refused. On the meta device only identity counts.
Consecutive blocks with identical tensors fold into one ``{i}`` template. A model with a transformers config
gets ``model.attention`` (its heads and KV heads), which the planner needs to size the KV cache of a fused
q/k/v projection or a latent attention, and to split attention by heads under tensor parallelism.

A model sharded with ``torch.distributed.tensor`` (DTensor params) is described whole: global
shapes, and each param's ``shard`` read from its placement (runtime/dtensor.py), so every rank
describes the same spec; ``local=True`` describes this rank's part instead (local shapes, no shard).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from runtime.dtensor import is_dtensor, local_tensor, shard_name
from runtime.guard import handle_of
from runtime.tensors import dtype_name
from runtime.ties import covering, extent, storage_key
from schemas.spec import SpecFile
from schemas.spec_build import LayerEntry, build_spec

log = logging.getLogger("runtime")

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def _own_tensors(module: nn.Module, non_persistent: bool) -> list[tuple[str, torch.Tensor, bool]]:
    out = [(n, t, False) for n, t in module._parameters.items() if t is not None]
    out += [(n, t, True) for n, t in module._buffers.items()
            if t is not None and (non_persistent or n not in module._non_persistent_buffers_set)]
    return out


def _tensors(module: nn.Module, non_persistent: bool) -> list[tuple[str, torch.Tensor, bool]]:
    """Every tensor of ``module`` and its descendants (shared ones under each name), in order."""
    out = []
    for path, sub in module.named_modules(remove_duplicate=False):
        for n, t, is_buffer in _own_tensors(sub, non_persistent):
            out.append((f"{path}.{n}" if path else n, t, is_buffer))
    return out


def find_layers(model: nn.Module, non_persistent: bool = False) -> list[tuple[str, nn.Module]]:
    """The layers of ``model`` in registration order: (dotted path, module)."""

    def holds(module: nn.Module) -> bool:
        return bool(_tensors(module, non_persistent))

    def walk(module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
        if prefix and _own_tensors(module, non_persistent):
            return [(prefix, module)]
        out: list[tuple[str, nn.Module]] = []
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(child, _CONTAINERS):
                out += [(f"{path}.{sub}", block) for sub, block in child.named_children() if holds(block)]
                if _own_tensors(child, non_persistent):
                    out.append((path, child))
            elif holds(child):
                out += walk(child, path)
        return out

    layers = walk(model, "")
    if _own_tensors(model, non_persistent):
        names = ", ".join(n for n, _, _ in _own_tensors(model, non_persistent))
        log.warning("describe: tensors held by the root module itself (%s) cannot form a layer and are "
                    "left out of the spec: runtime.apply refuses a model whose params or persistent buffers its "
                    "plan leaves out, unless unplanned='move' puts them on the device outside the plan's "
                    "accounting (non-persistent buffers always move)", names)
    return layers


def _true_values(model: nn.Module) -> dict[int, torch.Tensor]:
    """Of a model holding applied plans (itself, or parts of it): id -> true value of every tensor
    whose ``.data`` is a compute copy (a slot, a UVA view, a placeholder), not its value."""
    handles = {id(h): h for m in model.modules() if (h := handle_of(m)) is not None}
    return {k: v for h in handles.values() for k, v in h.true_values().items()}


def _owners(named: list[tuple[str, torch.Tensor, bool]]) -> dict[str, str]:
    """Full name -> the full name of its tie group's owner (itself when it shares no storage).
    ``named``: (full name, tensor, whether it is an offloaded tensor's host copy: those share
    arenas without being tied, and an offloaded tensor is never tied)."""
    groups: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
    for full, t, moved in named:
        groups.setdefault(("object", id(t)) if moved else storage_key(t), []).append((full, t))
    out: dict[str, str] = {}
    for members in groups.values():
        i = covering([local_tensor(t) for _, t in members])
        if i is None:
            spans = ", ".join(f"'{full}' (bytes {a}..{b})" for full, t in members
                              for a, b in [extent(local_tensor(t))])
            raise ValueError(f"{spans} are views of one storage, and none of them covers the others: a spec "
                             f"ties a tensor to one owner holding all its bytes. Make one param hold the whole "
                             f"storage (the others views of it), or give each its own storage (.clone())")
        for full, _ in members:
            out[full] = members[i][0]
    return out


def _entry(t: torch.Tensor, is_buffer: bool) -> dict:
    entry: dict = {"shape": list(t.shape), "dtype": dtype_name(t.dtype)}
    if t.numel() > 1 and not t.is_contiguous():
        entry["stride"] = list(t.stride())
    if is_buffer:
        entry["buffer"] = True
    return entry


def moe_of(module: nn.Module) -> dict[str, int] | None:
    """{experts, top_k} of a mixture-of-experts layer: read from its router, the submodule that
    holds both ``num_experts`` and ``top_k`` (transformers' Mixtral, Qwen-MoE, ...), or None."""
    for sub in module.modules():
        experts = getattr(sub, "num_experts", None) or getattr(sub, "n_routed_experts", None)
        top_k = getattr(sub, "top_k", None) or getattr(sub, "num_experts_per_tok", None)
        if isinstance(experts, int) and isinstance(top_k, int) and 0 < top_k <= experts:
            return {"experts": experts, "top_k": top_k}
    return None


def attention_of(model: nn.Module) -> dict[str, int] | None:
    """``{heads, kv_heads}`` from the model's (text) config, as transformers names them
    (``num_attention_heads``, ``num_key_value_heads``), or None: what the spec's ``model.attention`` records,
    so the planner can split fused q/k/v projections (tensor parallel, the KV cache's size)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    if not isinstance(heads, int) or not isinstance(kv, int) or heads <= 0 or kv <= 0 or heads % kv:
        return None
    return {"heads": heads, "kv_heads": kv}


def describe(model: nn.Module, name: str | None = None, dtype: str | None = None, *,
             non_persistent: bool = False, fold: bool = True, local: bool = False) -> SpecFile:
    """The spec of ``model``: its layers in order, every param and buffer, ties, folded blocks.

    ``name`` defaults to the model's class name, ``dtype`` (the spec's default dtype) to the
    dtype holding the most elements. ``non_persistent=True`` lists non-persistent buffers too.
    A model with DTensor params gets global shapes and a ``shard`` per param; ``local=True``:
    this rank's local shards instead, without ``shard``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"describe() reads an nn.Module, got a {type(model).__name__}")
    layers = find_layers(model, non_persistent)
    if not layers:
        raise ValueError("the model holds no parameters or buffers below its root")
    sharded = not local and any(is_dtensor(t) for _, t, _ in _tensors(model, non_persistent))
    vocab = {m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)}
    true = _true_values(model)
    found = [[(rel, true.get(id(t), t), id(t) in true, is_buffer) for rel, t, is_buffer in _tensors(module, non_persistent)]
             for _, module in layers]
    owner_of = _owners([(f"{lname}.{rel}", t, moved) for (lname, _), held in zip(layers, found)
                        for rel, t, moved, _ in held])
    entries: list[LayerEntry] = []
    for (lname, module), held in zip(layers, found):
        entry = LayerEntry(lname)
        for rel, t, _, is_buffer in held:
            owner = owner_of[f"{lname}.{rel}"]
            if owner != f"{lname}.{rel}":
                entry.tied[rel] = owner
                continue
            entry.params[rel] = _entry(local_tensor(t) if local else t, is_buffer)
            if sharded:
                sub = module.get_submodule(rel.rpartition(".")[0]) if "." in rel else module
                try:
                    entry.params[rel]["shard"] = shard_name(t, sub, vocab)
                except ValueError as exc:
                    raise ValueError(f"'{lname}.{rel}': {exc}") from None
        entry.moe = moe_of(module)
        entries.append(entry)
    return build_spec(name or type(model).__name__, entries, dtype, fold, attention=attention_of(model))
