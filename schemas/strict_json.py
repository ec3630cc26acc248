"""JSON as the standard defines it, read strictly: a duplicate key or a NaN is an error.

Python's ``json`` keeps the last of two equal keys and accepts ``NaN``/``Infinity``; a
checkpoint header or a model config with either is broken, so both are reported with the
file name (and, for syntax errors, the line and column).
"""

from __future__ import annotations

import json
from typing import Any

from schemas.errors import InputError


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _constant(name: str) -> float:
    raise ValueError(name)


def loads_strict(text: str | bytes, source: str, what: str = "the file") -> Any:
    """The JSON value of ``text``, or InputError naming ``source`` (``what``: e.g. 'the header')."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, object_pairs_hook=_object, parse_constant=_constant)
    except UnicodeDecodeError as err:
        raise InputError(f"{source}: {what} is not UTF-8 text (byte {err.start}); not valid JSON") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{source}: {what} is not valid JSON: {err.msg} at line {err.lineno} "
                         f"column {err.colno}") from None
    except _Duplicate as err:
        raise InputError(f"{source}: {what} has the key '{err.key}' twice (JSON keys must be unique)") from None
    except ValueError as err:  # NaN, Infinity
        raise InputError(f"{source}: {what} is not valid JSON: {err} is not a JSON value") from None
    except RecursionError:
        raise InputError(f"{source}: {what} nests too deeply to be read") from None
