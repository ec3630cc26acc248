"""A spec from safetensors checkpoints, reading only their headers (never the weights).

``safetensors_file`` reads and checks one file's header, ``safetensors_index`` a whole
checkpoint (file, index or folder), ``tensor_layers`` groups the tensors into layers; here
they become a spec, identical blocks folded. Every error names the file it is about.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from planner.sources.safetensors_index import read_checkpoint
from planner.sources.tensor_layers import group_layers
from schemas.errors import InputError
from schemas.spec import SpecFile
from schemas.spec_build import build_spec


def spec_from_safetensors(path: str | Path, name: str | None = None) -> SpecFile:
    """A spec of the checkpoint at ``path`` (file, index or folder), identical blocks folded."""
    path = Path(path)
    tensors = read_checkpoint(path)
    if name is None:
        folder = path.resolve() if path.is_dir() else path.resolve().parent
        name = path.stem if path.is_file() and path.suffix == ".safetensors" and path.stem != "model" \
            else folder.name
    try:
        return build_spec(name, group_layers(tensors), param_order="name")  # a header keeps names, not the module's order
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InputError(f"{path}: the tensor names do not make a valid spec: {where}: {first['msg']}") from None
    except ValueError as err:
        raise InputError(f"{path}: the tensors do not make a spec: {err}") from None
