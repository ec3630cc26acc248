"""The hash a plan records of the spec it was made from (``summary.spec_sha256``)."""

from __future__ import annotations

import hashlib

from schemas.spec import SpecFile


def spec_sha256(spec: SpecFile) -> str:
    """sha256 of the spec's JSON as loaded (before any override): fields in schema order, layers
    and params in file order, comments and formatting ignored."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()
