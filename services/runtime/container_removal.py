"""Removing a sandbox container for good: its keeper first, its volume with it, and a removal
someone else began waited out, so that "removed" means removed.

Blocking (docker-py): DockerSandboxes runs it on its threads.
"""

from __future__ import annotations

import time
from typing import Any

from docker.errors import APIError, NotFound

from .keepers import remove_keeper

__all__ = ["remove_container"]


def remove_container(api: Any, container_id: str, *, keeper: bool) -> None:
    """Remove the container and its anonymous volumes; `keeper`: it may have a workspace
    keeper (a tmpfs workspace), removed first."""
    if keeper:
        # A stopped sandbox's keeper holds its workspace volume: it goes first, so the
        # volume goes with the container.
        remove_keeper(api, container_id)
    try:
        api.remove_container(container_id, v=True, force=True)
    except NotFound:
        pass
    except APIError as exc:
        if exc.status_code == 409 and "already in progress" in str(exc):
            # Someone else is removing it: return only once it is gone, so "removed"
            # means removed (a shutdown must not leave it behind).
            _wait_gone(api, container_id)
            return
        raise


def _wait_gone(api: Any, container_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            api.inspect_container(container_id)
        except NotFound:
            return
        time.sleep(0.1)
