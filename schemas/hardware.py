"""Hardware profiles by name: the bundled ones (``schemas/profiles/NAME.yaml``) and profile files.

A profile (``schemas.hardware_profile``) is named by its bundled name or by a file path
(``--hardware h200`` / ``--hardware my.yaml``).
"""

from __future__ import annotations

import os
from pathlib import Path

from schemas.errors import InputError, suggest
from schemas.hardware_profile import HardwareProfile
from schemas.io import load_model

PROFILES = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "h200"


def bundled_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def is_profile_file(key: str) -> bool:
    """Whether ``--hardware KEY`` (or a spec's ``hardware: KEY``) names a file rather than a bundled profile."""
    return "/" in key or key.endswith((".yaml", ".yml", ".json"))


def spec_hardware(value: str | None, spec_path: str | Path) -> str | None:
    """A spec's ``hardware:`` as ``load_hardware`` takes it: a bundled name as written, a relative file
    resolved against the folder of the spec file at ``spec_path`` (a spec read from stdin, ``-``: against
    the current folder), so that a spec means the same profile from wherever it is planned."""
    if value is None or not is_profile_file(value) or str(spec_path) == "-" or Path(value).is_absolute():
        return value
    return os.path.normpath(os.path.join(os.path.dirname(str(spec_path)), value))


def load_hardware(name_or_path: str | Path | None = None) -> HardwareProfile:
    """A bundled profile by name, or a profile file; InputError naming the file when it is bad."""
    key = str(name_or_path or DEFAULT_PROFILE)
    bundled = PROFILES / f"{key}.yaml"
    if not is_profile_file(key):
        if not bundled.is_file():
            raise InputError(f"--hardware: no bundled profile '{key}'{suggest(key, bundled_profiles())}; "
                             f"bundled: {', '.join(bundled_profiles())}; or give a profile file "
                             "(make one with `planner calibrate -o my-gpu.yaml`)")
        return load_model(HardwareProfile, bundled)
    return load_model(HardwareProfile, key)
