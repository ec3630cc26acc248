"""Moving a model's tensors for a plan, and putting them back exactly.

``Placement`` remembers, per tensor the plan touches, its original device, and, once
it is offloaded, the host view that holds its true value. ``restore()`` is both the
rollback of a failed ``apply`` and ``Handle.remove()``: every tensor goes back to its
original device with bit-identical values and its own storage, and the host arenas
(pinned memory) are released layer by layer, so restoring needs at most one layer of
extra host memory.

Tensors that are views of one storage (runtime/ties.py) share one entry and move as one: the
bytes they span are copied once and each becomes the same view of the copy, so aliasing survives
``apply`` and ``remove()``. ``group`` finds them before anything moves; such a group is never
offloaded (the plan's checks refuse it).

For a DTensor param the placement moves its local shard (``TensorRef.local``): the param object,
its local tensor object and its layout stay, only the shard's storage moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.offloader import Offloaded
from runtime.dtensor import param_value
from runtime.pinned import HostArena, pack
from runtime.tensors import TensorRef
from runtime.ties import rehome, storage_key


@dataclass(eq=False)
class _Entry:
    ref: TensorRef
    tensor: torch.Tensor  # the nn.Parameter / buffer object (identity kept)
    target: torch.Tensor  # the tensor whose .data moves: ``tensor``, or a DTensor param's local shard
    device: torch.device  # where it was before apply
    host: torch.Tensor | None = None  # host view holding its value while offloaded
    aliases: list[torch.Tensor] = field(default_factory=list)  # other targets: views of its storage

    def views(self) -> list[torch.Tensor]:
        return [self.target, *self.aliases]


@dataclass(eq=False)
class Placement:
    entries: dict[int, _Entry] = field(default_factory=dict)  # id(tensor) -> entry
    arenas: list[tuple[HostArena, list[_Entry]]] = field(default_factory=list)

    def track(self, ref: TensorRef) -> _Entry:
        t = ref.tensor
        entry = self.entries.get(id(t))
        if entry is None:
            entry = self.entries[id(t)] = _Entry(ref, t, ref.local, ref.local.device)
        return entry

    def group(self, refs: list[TensorRef]) -> None:
        """Track ``refs`` before anything moves, views of one storage in one entry (the first
        tracked is its target)."""
        by_storage: dict[tuple, _Entry] = {}
        for entry in self.unique_entries():
            by_storage.setdefault(storage_key(entry.target), entry)
        for ref in refs:
            t = ref.tensor
            if id(t) in self.entries:
                continue
            entry = by_storage.get(storage_key(ref.local))
            if entry is None:
                by_storage[storage_key(ref.local)] = self.track(ref)
                continue
            if entry.host is not None or entry.target.device != entry.device:
                raise RuntimeError(f"{_name(entry)} moved before the tensors sharing its storage were found")
            if all(a is not ref.local for a in entry.views()):
                entry.aliases.append(ref.local)
            self.entries[id(t)] = entry

    def _set(self, entry: _Entry, data: torch.Tensor) -> None:
        if entry.aliases:
            raise RuntimeError(f"{_name(entry)} shares its storage with other tensors: it moves as a group")
        entry.target.data = data

    def offload_layer(self, refs: list[TensorRef], pin: bool) -> list[Offloaded]:
        """Copy these tensors (one layer's) into one host arena and point them at it.

        A tensor named twice (or already offloaded) is packed once. The arena is recorded
        before any param points into it, so a failure part-way is rolled back by restore()."""
        entries: list[_Entry] = []
        for r in refs:
            e = self.track(r)
            if e.host is None and all(x is not e for x in entries):
                if e.aliases:
                    raise RuntimeError(f"{_name(e)} shares its storage with other tensors: it cannot be offloaded")
                entries.append(e)
        if not entries:
            return []
        arena, views = pack([e.target.data for e in entries], pin)
        self.arenas.append((arena, entries))
        for e, v in zip(entries, views):
            e.host = v
            self._set(e, v)  # frees the device copy, if that was the only reference
        return [Offloaded(e.ref, e.host) for e in entries]

    def move(self, ref: TensorRef, device: torch.device) -> bool:
        """Move a resident tensor to ``device``; False when it was there already."""
        entry = self.track(ref)
        t = entry.target
        if t.device == device:
            return False
        if entry.aliases:
            rehome(entry.views(), device)
        else:
            self._set(entry, t.data.to(device))
        return True

    def restore(self) -> list[str]:
        """Put every tracked tensor back on its original device, values bit-identical.

        Tries every tensor even when one fails, and returns what it could not restore (empty
        when all is back). What failed stays tracked, so calling it again retries only that."""
        problems: list[str] = []
        for entry in self.unique_entries():
            if entry.host is None and entry.target.device != entry.device:
                try:
                    if entry.aliases:
                        rehome(entry.views(), entry.device)
                    else:
                        self._set(entry, entry.target.data.to(entry.device))
                except Exception as exc:  # noqa: BLE001 - reported after every tensor had its turn
                    problems.append(f"{_name(entry)}: could not move back to {entry.device}: {exc}")
        kept = []
        for arena, entries in self.arenas:
            failed = False
            for e in entries:
                if e.host is None:
                    continue
                try:
                    fresh = torch.empty_strided(e.host.shape, e.host.stride(), dtype=e.host.dtype, device=e.device)
                    fresh.copy_(e.host)
                    self._set(e, fresh)
                    e.host = None
                except Exception as exc:  # noqa: BLE001
                    failed = True
                    problems.append(f"{_name(e)}: could not copy back from host memory to {e.device}: {exc}")
            try:
                if any(e.device.type == "cuda" for e in entries):
                    torch.cuda.synchronize()
                if not failed:
                    arena.close()
            except Exception as exc:  # noqa: BLE001
                failed = True
                problems.append(f"host memory of {', '.join(_name(e) for e in entries[:3])}: {exc}")
            if failed:
                kept.append((arena, entries))
        self.arenas = kept
        return problems

    def unique_entries(self) -> list[_Entry]:
        return list({id(e): e for e in self.entries.values()}.values())

    def true_values(self) -> dict[int, torch.Tensor]:
        """id(tensor object) -> its host copy (for a DTensor param, a DTensor around it), for every
        tensor offloaded now (aliases too)."""
        return {key: param_value(e.tensor, e.host) for key, e in self.entries.items() if e.host is not None}

    @property
    def host_bytes(self) -> int:
        return sum(a.nbytes for a, _ in self.arenas)


def _name(entry: _Entry) -> str:
    return entry.ref.full.lstrip(".")
