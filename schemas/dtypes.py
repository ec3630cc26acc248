"""Element sizes of the dtypes a spec or plan may name.

Names are PyTorch's (without the ``torch.`` prefix). A few common short forms are
accepted on input and normalised to the canonical name, so plans stay stable.
"""

from __future__ import annotations

from schemas.errors import suggest

# bytes per element; packed sub-byte types count one storage element per byte
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
}

DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp64": "float64",
    "double": "float64",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "long": "int64",
    "int": "int32",
}


def canonical_dtype(name: str) -> str:
    """Return the canonical dtype name, or raise ValueError listing the valid ones."""
    key = name.strip().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        hint = suggest(key, [*DTYPE_BYTES, *DTYPE_ALIASES])
        raise ValueError(f"unknown dtype {name!r}{hint}; expected one of: {', '.join(DTYPE_BYTES)}")
    return key


def itemsize(dtype: str) -> int:
    size = DTYPE_BYTES.get(dtype)  # canonical names (what validated specs hold) need no lookup
    return size if size is not None else DTYPE_BYTES[canonical_dtype(dtype)]
