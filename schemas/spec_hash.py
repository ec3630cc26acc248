"""The hash a plan records of the spec it was made from (``summary.spec_sha256``)."""

from __future__ import annotations

import hashlib

from schemas.spec import SpecFile

# fields added to the spec after plans started recording its hash: left out while unset, so that the
# specs that do not use them keep the hash their plans already record
_LATER_FIELDS = {"offload": ("backends",), "model": ("attention", "param_order"),
                 "memory": ("kv_cache", "kv_cache_dtype", "kv_bytes_per_token", "activations", "workspace",
                            "graphs")}
_LATER_SECTIONS = ("parallel",)
_LATER_WORKLOAD_FIELDS = ("batch", "context", "logits")  # of each workload item


def spec_sha256(spec: SpecFile) -> str:
    """sha256 of the spec's JSON as loaded (before any override): fields in schema order, layers
    and params in file order, comments and formatting ignored."""
    unset = {section: {f for f in fields if getattr(getattr(spec, section), f) is None}
             for section, fields in _LATER_FIELDS.items()}
    exclude: dict[str, object] = {k: v for k, v in unset.items() if v}
    exclude.update({section: True for section in _LATER_SECTIONS if getattr(spec, section) is None})
    if spec.workload is not None:
        exclude["workload"] = {name: {f for f in _LATER_WORKLOAD_FIELDS if getattr(item, f) is None}
                               for name, item in spec.workload.items()}
    return hashlib.sha256(spec.model_dump_json(exclude=exclude).encode()).hexdigest()
