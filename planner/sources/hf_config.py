"""A spec from a Hugging Face ``config.json``: the model is built on the meta device (no
weights, no memory) with transformers and described with ``runtime.describe``.

torch and transformers are imported inside the function (the optional extra ``[hf]``);
the planner never imports torch at module level.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.errors import InputError
from schemas.spec import SpecFile

INSTALL_HINT = "pip install 'offload-planner[hf]'"


def read_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a config file (a folder means its config.json), or InputError."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: not valid JSON ({err})") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    if not isinstance(data.get("model_type"), str):
        raise InputError(f"{path}: model_type: missing; a Hugging Face config.json names its "
                         "architecture in model_type (e.g. \"llama\")")
    return data


def build_meta_model(data: dict[str, Any], where: str = "config.json"):
    """The transformers model of a config dict on the meta device (causal LM, else the base model)."""
    try:
        import torch
        import transformers
    except ImportError as err:
        raise InputError(f"--from-hf-config needs transformers and torch ({err.name} is not installed): "
                         f"{INSTALL_HINT}") from None
    data = dict(data)
    model_type = data.pop("model_type")
    for key in ("auto_map", "architectures", "transformers_version"):
        data.pop(key, None)
    try:
        config = transformers.AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as err:
        raise InputError(f"{where}: model_type '{model_type}' is not known to the installed transformers "
                         f"{transformers.__version__} ({str(err).splitlines()[0]}); a newer "
                         "transformers may have it") from None
    with torch.device("meta"):
        try:
            return transformers.AutoModelForCausalLM.from_config(config)
        except ValueError:
            return transformers.AutoModel.from_config(config)


def spec_from_hf_config(path: str | Path, name: str | None = None) -> SpecFile:
    """The spec of the model that ``config.json`` at ``path`` describes, built on the meta device."""
    data = read_config(path)
    model = build_meta_model(data, str(path))
    from runtime.describe import describe

    if name is None:
        folder = Path(path) if Path(path).is_dir() else Path(path).resolve().parent
        name = folder.name or data["model_type"]
    return describe(model, name=name)
