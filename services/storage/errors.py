"""What can go wrong in the storage service: every exception of its own derives from
StorageError (it defines none other yet: a history request that fails is answered with the
error in its reply)."""

from __future__ import annotations

__all__ = ["StorageError"]


class StorageError(Exception):
    """The root of the storage service's own exceptions: an event log it could not keep or
    read."""
