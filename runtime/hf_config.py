"""A spec from a Hugging Face ``config.json``: the model is built on the meta device (no
weights, no memory) with transformers and described with ``runtime.describe``.

The config is read as strict JSON, its structural fields are checked
(``runtime.hf_config_check``), the size it describes is capped, and anything transformers
still raises while building becomes an InputError naming the file and the model_type: bad
input never ends in a traceback. transformers is imported inside the functions (the
optional extra ``[hf]``), so a missing install is a message too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.hf_config_check import Known, config_problems, size_problems
from schemas.errors import InputError
from schemas.input_file import read_input
from schemas.spec import SpecFile
from schemas.strict_json import loads_strict

INSTALL_HINT = "pip install 'offload-planner[hf]'"
NOT_CONFIG_KEYS = ("model_type", "auto_map", "architectures", "transformers_version")


def read_config(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The config file (a folder means its config.json) and its JSON object, or InputError."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    data = loads_strict(read_input(path), str(path))
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    if not isinstance(data.get("model_type"), str) or not data["model_type"]:
        raise InputError(f"{path}: model_type: missing; a Hugging Face config.json names its "
                         "architecture in model_type (e.g. \"llama\")")
    return path, data


def _transformers():
    try:
        import torch  # noqa: F401 - transformers needs it to build models
        import transformers
    except ImportError as err:
        raise InputError(f"--from-hf-config needs transformers and torch ({err.name} is not installed): "
                         f"{INSTALL_HINT}") from None
    return transformers


def known_names(transformers) -> Known:
    from transformers.activations import ACT2FN
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return Known(transformers.__version__, list(CONFIG_MAPPING.keys()), list(ACT2FN.keys()),
                 ["default", *ROPE_INIT_FUNCTIONS])


def _first_line(err: BaseException) -> str:
    """``Type: first line`` of an exception (its second line too when the first ends in ':')."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _text_values(config) -> dict[str, Any]:
    """The fields of the (text part of the) built config, defaults filled in."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return text.to_dict()


def build_meta_model(data: dict[str, Any], source: str = "config.json"):
    """The transformers model of a config dict on the meta device (causal LM, else the base model)."""
    transformers = _transformers()
    import torch

    problems = config_problems(data, source, known_names(transformers))
    if problems:
        raise InputError(problems)
    model_type = data["model_type"]
    kwargs = {k: v for k, v in data.items() if k not in NOT_CONFIG_KEYS}
    failed = f"{source}: transformers {transformers.__version__} cannot build model_type '{model_type}'"
    try:
        config = transformers.AutoConfig.for_model(model_type, **kwargs)
    except Exception as err:  # noqa: BLE001 - whatever transformers raises is about this config
        raise InputError(f"{failed}: {_first_line(err)}") from None
    try:
        problems = size_problems(_text_values(config), source)
    except Exception as err:  # noqa: BLE001
        raise InputError(f"{failed}: {_first_line(err)}") from None
    if problems:
        raise InputError(problems)
    try:
        with torch.device("meta"):
            try:
                return transformers.AutoModelForCausalLM.from_config(config)
            except ValueError as err:
                if "Unrecognized configuration class" not in str(err):
                    raise
                return transformers.AutoModel.from_config(config)
    except Exception as err:  # noqa: BLE001 - the last line of defence: never a traceback
        raise InputError(f"{failed}: {_first_line(err)}") from None


def spec_from_hf_config(path: str | Path, name: str | None = None) -> SpecFile:
    """The spec of the model that ``config.json`` at ``path`` describes, built on the meta device."""
    file, data = read_config(path)
    model = build_meta_model(data, str(file))
    from runtime.describe import describe

    if name is None:
        folder = Path(path) if Path(path).is_dir() else Path(path).resolve().parent
        name = folder.name or data["model_type"]
    try:
        return describe(model, name=name)
    except ValueError as err:
        raise InputError(f"{file}: the model of model_type '{data['model_type']}' cannot be described: "
                         f"{err}") from None
