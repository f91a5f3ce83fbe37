"""Response body of the readiness probe."""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["ReadinessReport"]


class ReadinessReport(BaseModel):
    ready: bool
    checks: dict[str, str] = Field(description="'ok' or what failed, per dependency.")
