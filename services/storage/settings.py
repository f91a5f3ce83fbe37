"""Settings of the storage service."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from shared.settings import CommonSettings

__all__ = ["StorageSettings"]


class StorageSettings(CommonSettings):
    data_dir: Path = Field(
        default=Path(".run/storage"), description="Where the event database lives (a volume)."
    )
    replica: str = Field(
        default="storage-0",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Each replica keeps a full copy under its own durable consumer name.",
    )
    batch_size: int = Field(
        default=128,
        ge=1,
        le=1024,
        description="Events taken from the log at once; a batch's rows share one commit (one "
        "fsync), and one batch is stored at a time.",
    )
    batch_wait_s: float = Field(
        default=0.1,
        gt=0,
        le=5,
        description="How long a batch waits to fill: the longest an event waits to be stored "
        "when events come one by one.",
    )
    consumer_inactive_s: float = Field(
        default=7 * 24 * 3600.0,
        ge=1,
        description="A replica's durable consumers (named for it) are removed by NATS after "
        "this long without it: a replica scaled away for good leaves nothing behind. One that "
        "comes back later reads the whole log again (storing is idempotent by seq).",
    )
