"""The base of every file model: unknown keys are errors and loaded models are frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys are errors, so a misspelled key never silently does nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)
