"""All tensors of a checkpoint: one ``.safetensors`` file, an index file, or a folder.

A folder holds ``model.safetensors.index.json`` (``weight_map``: tensor name -> shard file
in the same folder) and its shards, or plain ``*.safetensors`` files. The index and its
shards must agree both ways: every mapped tensor is in its shard's header, and every
tensor of a shard is mapped to that shard. No tensor may be in two files.
"""

from __future__ import annotations

from pathlib import Path

from planner.sources.safetensors_file import HeaderTensor, read_header
from schemas.errors import InputError
from schemas.input_file import read_input
from schemas.strict_json import loads_strict

INDEX_NAME = "model.safetensors.index.json"


def read_checkpoint(path: str | Path) -> list[HeaderTensor]:
    """All tensors of a ``.safetensors`` file, an index file, or a folder of shards."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    if path.is_dir():
        index = path / INDEX_NAME
        if index.is_file():
            return _read_index(index)
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise InputError(f"{path}: no {INDEX_NAME} and no *.safetensors files in this folder")
        return _unique([t for f in files for t in read_header(f)], path)
    if path.name.endswith(".json"):
        return _read_index(path)
    return _unique(read_header(path), path)


def _weight_map(index: Path) -> dict[str, str]:
    data = loads_strict(read_input(index), str(index))
    if not isinstance(data, dict) or "weight_map" not in data:
        raise InputError(f"{index}: expected an object with a non-empty 'weight_map' "
                         "(tensor name -> shard file)")
    weight_map = data["weight_map"]
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{index}: weight_map: expected a non-empty mapping of tensor names to shard "
                         f"files, got {type(weight_map).__name__ if weight_map else 'nothing'}")
    for name, shard in weight_map.items():
        if not name:
            raise InputError(f"{index}: weight_map: a tensor has an empty name")
        if not isinstance(shard, str) or not shard or Path(shard).name != shard:
            raise InputError(f"{index}: weight_map['{name}']: expected a file name in the same folder, "
                             f"got {shard!r}")
    return weight_map


def _read_index(index: Path) -> list[HeaderTensor]:
    weight_map = _weight_map(index)
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, []).append(name)
    tensors: list[HeaderTensor] = []
    for shard, names in shards.items():
        file = index.parent / shard
        if not file.is_file():
            raise InputError(f"{index}: names shard '{shard}' (for {len(names)} tensors such as "
                             f"'{names[0]}'), which is not in {index.parent}")
        found = read_header(file)
        have = {t.name for t in found}
        missing = [n for n in names if n not in have]
        if missing:
            raise InputError(f"{index}: tensor '{missing[0]}' is mapped to '{shard}', whose header "
                             f"lacks it ({len(missing)} such tensors)")
        unlisted = [t.name for t in found if weight_map.get(t.name) != shard]
        if unlisted:
            first = unlisted[0]
            elsewhere = (f"which {index} maps to '{weight_map[first]}'" if first in weight_map
                         else f"which {index} does not list in weight_map")
            raise InputError(f"{file}: holds tensor '{first}', {elsewhere} ({len(unlisted)} such tensors)")
        tensors += found
    return _unique(tensors, index)


def _unique(tensors: list[HeaderTensor], where: Path) -> list[HeaderTensor]:
    seen: dict[str, str] = {}
    for t in tensors:
        if t.name in seen:
            raise InputError(f"tensor '{t.name}' is in both {seen[t.name]} and {t.file}")
        seen[t.name] = t.file
    if not tensors:
        raise InputError(f"{where}: the checkpoint holds no tensors")
    return tensors
