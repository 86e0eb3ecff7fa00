"""The base of every config section: unknown keys are refused at load (a typo names its key),
and assignments are validated too."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
