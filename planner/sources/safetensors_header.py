"""A spec from safetensors checkpoints, reading only their headers (never the weights).

A ``.safetensors`` file starts with an 8-byte little-endian header length N, then N bytes
of JSON: ``{tensor name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {..}}``,
then the data. The header is parsed here from that documented layout rather than through
the ``safetensors`` package so that ``planner spec`` needs no optional extra and a broken
file is reported with what exactly is wrong (tests cross-check against ``safe_open``).

A folder holds ``model.safetensors.index.json`` (``weight_map``: tensor -> shard file)
and its shards, or plain ``*.safetensors`` files. Tensors are grouped into layers by name:
``<stack>.<N>.<rest>`` belongs to the block ``<stack>.<N>``, any other tensor to its module
(``model.norm.weight`` -> ``model.norm``, or the outermost such module above it). Layers are
ordered embeddings, other modules, the block stacks by index, final norms, the head.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from schemas.dtypes import itemsize
from schemas.errors import InputError
from schemas.spec import SpecFile
from schemas.spec_build import LayerEntry, build_spec

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit

# safetensors dtype -> our (PyTorch) dtype name
DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}


@dataclass(frozen=True)
class HeaderTensor:
    name: str
    dtype: str  # ours, e.g. bfloat16
    shape: tuple[int, ...]
    nbytes: int
    file: str


def read_header(path: str | Path) -> list[HeaderTensor]:
    """The tensors listed in one ``.safetensors`` file's header, checked against the file's size."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            head = f.read(8)
            if len(head) < 8:
                raise InputError(f"{path}: not a safetensors file: {size} bytes, shorter than the "
                                 "8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise InputError(f"{path}: not a safetensors file or truncated: the header length says "
                                 f"{n} bytes but only {size - 8} follow")
            if n > MAX_HEADER_BYTES:
                raise InputError(f"{path}: header of {n} bytes is larger than the format's limit "
                                 f"({MAX_HEADER_BYTES} bytes)")
            raw = f.read(n)
    except OSError as err:  # no such file, a directory, no permission
        raise InputError(f"{path}: cannot read: {(err.strerror or str(err)).lower()}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: the header is not JSON ({err}); not a safetensors file?") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: the header is a JSON {type(header).__name__}, expected an object")
    return _tensors(path, header, size - 8 - n)


def _tensors(path: Path, header: dict, data_bytes: int) -> list[HeaderTensor]:
    out = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor '{name}'"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise InputError(f"{where}: expected an object with dtype, shape and data_offsets")
        st_dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if st_dtype not in DTYPES:
            raise InputError(f"{where}: unsupported dtype {st_dtype!r}; supported: {', '.join(DTYPES)}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise InputError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
            raise InputError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, "
                             f"got {offsets!r}")
        dtype = DTYPES[st_dtype]
        nbytes = math.prod(shape) * itemsize(dtype)
        if offsets[1] - offsets[0] != nbytes:
            raise InputError(f"{where}: data_offsets span {offsets[1] - offsets[0]} bytes but "
                             f"{st_dtype} {shape} needs {nbytes}")
        if offsets[1] > data_bytes:
            raise InputError(f"{where}: data ends at byte {offsets[1]} but the file holds only "
                             f"{data_bytes} bytes of data (truncated?)")
        out.append(HeaderTensor(name, dtype, tuple(shape), nbytes, str(path)))
    return out


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


def _read_index(index: Path) -> list[HeaderTensor]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{index}: not valid JSON ({err})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{index}: expected an object with a non-empty 'weight_map' "
                         "(tensor name -> shard file)")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or not shard:
            raise InputError(f"{index}: weight_map['{name}']: expected a file name in the same folder, "
                             f"got {shard!r}")
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


# ---------------------------------------------------------------------------
# grouping into layers

_BLOCK = re.compile(r"^(.+?)\.(\d+)\.(.+)$")
_HEADS = {"lm_head", "head", "output", "score", "classifier", "embed_out"}


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _rank(layer: str, stack: str | None) -> int:
    """0 embeddings, 1 other modules, 2 blocks, 3 final norms, 4 the head."""
    last = layer.rsplit(".", 1)[-1]
    if stack is not None:
        return 2
    if last in _HEADS:
        return 4
    if "embed" in layer or last in ("wte", "wpe"):
        return 0
    if "norm" in last or last in ("ln_f",):
        return 3
    return 1


def group_layers(tensors: list[HeaderTensor]) -> list[LayerEntry]:
    """Layers of the tensors (by name), in execution order, tensors within a layer by name."""
    blocks: dict[str, str] = {}  # block layer -> its stack prefix
    members: dict[str, list[tuple[str, HeaderTensor]]] = {}
    modules: set[str] = set()
    for t in tensors:
        m = _BLOCK.match(t.name)
        if m:
            blocks[f"{m.group(1)}.{m.group(2)}"] = m.group(1)
        elif "." in t.name:
            modules.add(t.name.rpartition(".")[0])
        else:
            raise InputError(f"tensor '{t.name}' has no module path (expected names such as "
                             "'model.norm.weight'), so it cannot be placed in a layer")
    for t in tensors:
        m = _BLOCK.match(t.name)
        if m:
            layer = f"{m.group(1)}.{m.group(2)}"
        else:
            module = t.name.rpartition(".")[0]
            parts = module.split(".")
            layer = next(".".join(parts[:k]) for k in range(1, len(parts) + 1)
                         if ".".join(parts[:k]) in modules)
        members.setdefault(layer, []).append((t.name[len(layer) + 1:], t))

    def key(layer: str) -> tuple:
        stack = blocks.get(layer)
        return (_rank(layer, stack), _natural(stack or ""), _natural(layer))

    entries = []
    for layer in sorted(members, key=key):
        params = {rel: {"shape": list(t.shape), "dtype": t.dtype}
                  for rel, t in sorted(members[layer], key=lambda x: _natural(x[0]))}
        entries.append(LayerEntry(layer, params))
    return entries


def spec_from_safetensors(path: str | Path, name: str | None = None) -> SpecFile:
    """A spec of the checkpoint at ``path`` (file, index or folder), identical blocks folded."""
    path = Path(path)
    tensors = read_checkpoint(path)
    if name is None:
        folder = path.resolve() if path.is_dir() else path.resolve().parent
        name = path.stem if path.is_file() and path.suffix == ".safetensors" and path.stem != "model" \
            else folder.name
    return build_spec(name, group_layers(tensors))
