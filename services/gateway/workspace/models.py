"""Response body of a task's workspace upload."""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["UploadResult"]


class UploadResult(BaseModel):
    files: int = Field(description="Files (and symbolic links) written.")
