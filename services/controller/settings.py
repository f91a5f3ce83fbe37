"""Settings of the controller."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommonSettings

__all__ = ["ControllerSettings"]


class ControllerSettings(CommonSettings):
    workers: int = Field(default=8, ge=1, description="Events handled concurrently.")
    cas_attempts: int = Field(
        default=20, ge=1, description="Reload-and-retry rounds when another replica wrote first."
    )
