"""One ``.safetensors`` file's header, read and checked completely in one place (never the weights).

The layout: an 8-byte little-endian header length N, N bytes of JSON
``{tensor name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}``,
then the data section. The format requires what ``safetensors.safe_open`` enforces, and
this reader checks the same, naming the file and the tensor:

- the JSON is an object without duplicate keys; ``__metadata__`` is absent, null or a
  mapping of strings to strings; tensor names are non-empty;
- each tensor has a known dtype, a shape of integers >= 0 and ``data_offsets`` spanning
  exactly ``prod(shape) * itemsize`` bytes;
- the tensors tile the data section: sorted by offset, each starts where the previous one
  ended (no overlap, no hole), the first at 0 and the last at the end of the file.

The header is parsed here rather than through the ``safetensors`` package so that
``planner spec`` needs no optional extra and every problem is reported with the file and
the field (tests cross-check each rule against ``safe_open``).
"""

from __future__ import annotations

import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.dtypes import itemsize
from schemas.errors import InputError, Problem, suggest
from schemas.strict_json import loads_strict

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
METADATA = "__metadata__"
FIELDS = ("dtype", "shape", "data_offsets")

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
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
SUB_BYTE = ("F4", "F6_E2M3", "F6_E3M2")  # valid in the format, not (yet) in specs


@dataclass(frozen=True)
class HeaderTensor:
    name: str
    dtype: str  # ours, e.g. bfloat16
    shape: tuple[int, ...]
    nbytes: int
    file: str
    begin: int = 0  # data_offsets, relative to the data section
    end: int = 0


def read_header(path: str | Path) -> list[HeaderTensor]:
    """The tensors listed in one ``.safetensors`` file's header, checked against the format."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise InputError(f"{path}: not a regular file; a safetensors file is read by its size and offsets")
            size = info.st_size
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
    header = loads_strict(raw, str(path), "the header")
    if not isinstance(header, dict):
        raise InputError(f"{path}: the header is a JSON {type(header).__name__}, expected an object; "
                         "not a safetensors file?")
    return check_header(str(path), header, size - 8 - n)


def check_header(source: str, header: dict[str, Any], data_bytes: int) -> list[HeaderTensor]:
    """The tensors of a parsed header whose data section holds ``data_bytes``, or InputError
    listing every problem (each naming ``source`` and the tensor)."""
    problems: list[str] = []
    meta = header.get(METADATA)
    if meta is not None and not (isinstance(meta, dict)
                                 and all(isinstance(v, str) for v in meta.values())):
        problems.append(f"{METADATA}: expected a mapping of strings to strings, got {_got(meta)}")
    tensors = []
    for name, info in header.items():
        if name == METADATA:
            continue
        tensor = _tensor(source, name, info, problems)
        if tensor is not None:
            tensors.append(tensor)
    if not problems:
        problems += _coverage(tensors, data_bytes)
    if problems:
        raise InputError([Problem(p, source) for p in problems])
    return tensors


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _tensor(source: str, name: str, info: Any, problems: list[str]) -> HeaderTensor | None:
    where = f"tensor '{name}'"
    if not name:
        problems.append("a tensor has an empty name")
        return None
    if not isinstance(info, dict):
        problems.append(f"{where}: expected an object with dtype, shape and data_offsets, got {_got(info)}")
        return None
    missing = [k for k in FIELDS if k not in info]
    if missing:
        extra = [k for k in info if k not in FIELDS]
        hints = "".join(suggest(k, extra) for k in missing)
        problems.append(f"{where}: missing {', '.join(missing)}{hints}; each tensor needs dtype, shape "
                        "and data_offsets")
        return None
    st_dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    count = len(problems)
    if st_dtype in SUB_BYTE:
        problems.append(f"{where}: dtype {st_dtype} (sub-byte) is not supported by specs yet")
    elif st_dtype not in DTYPES:
        hint = suggest(str(st_dtype).upper(), list(DTYPES)) if isinstance(st_dtype, str) else ""
        problems.append(f"{where}: unsupported dtype {_got(st_dtype)}{hint}; supported: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        problems.append(f"{where}: shape must be a list of non-negative integers, got {_got(shape)}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
        problems.append(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, "
                        f"got {_got(offsets)}")
    if len(problems) > count:
        return None
    dtype = DTYPES[st_dtype]
    nbytes = math.prod(shape) * itemsize(dtype)
    begin, end = offsets
    if end - begin != nbytes:
        problems.append(f"{where}: data_offsets [{begin}, {end}] span {end - begin} bytes but "
                        f"{st_dtype} {shape} needs {nbytes}")
        return None
    return HeaderTensor(name, dtype, tuple(shape), nbytes, source, begin, end)


def _coverage(tensors: list[HeaderTensor], data_bytes: int) -> list[str]:
    """The tensors must tile the data section exactly: no overlap, no hole, nothing past the end."""
    problems = []
    cursor, previous = 0, None
    for t in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if t.end > data_bytes:
            problems.append(f"tensor '{t.name}': data ends at byte {t.end} but the file holds only "
                            f"{data_bytes} bytes of data (truncated?)")
            break
        if t.begin < cursor:
            problems.append(f"tensor '{t.name}': data_offsets [{t.begin}, {t.end}] overlap tensor "
                            f"'{previous.name}' [{previous.begin}, {previous.end}]")
        elif t.begin > cursor:
            problems.append(f"tensor '{t.name}': data_offsets start at byte {t.begin}, but bytes "
                            f"{cursor}..{t.begin} of the data belong to no tensor (a hole)")
        cursor, previous = max(cursor, t.end), t
    else:
        if cursor < data_bytes:
            problems.append(f"the data section holds {data_bytes} bytes but the tensors cover only "
                            f"{cursor}; {data_bytes - cursor} bytes at the end belong to no tensor")
    return problems
