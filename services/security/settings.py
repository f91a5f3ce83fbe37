"""Settings of the security monitor."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommonSettings

__all__ = ["SecuritySettings"]


class SecuritySettings(CommonSettings):
    workspace_root: str = Field(
        default="/workspace", description="Files may only be written under this sandbox path."
    )
    workers: int = Field(default=64, ge=1, description="Reviews handled concurrently.")
