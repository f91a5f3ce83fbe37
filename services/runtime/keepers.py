"""Workspace keepers: the files of a stopped sandbox whose /workspace is a sized tmpfs volume.

The workspace quota is a Docker local volume of type tmpfs (see DockerSandboxes.host_config).
Docker mounts such a volume when the first container using it starts and unmounts it, files
and all, when the last one stops. A sandbox stopped while its task waits (idle stop, or its
seat given to the queue) must find its files again when it starts, so before the stop a
keeper is started: a container that only mounts the volume (read-only) and sleeps, with no
network, no capabilities and a few MiB of memory, confined as the sandbox is (isolation.py).
Once the sandbox runs again, its keeper is removed; removing the sandbox removes its keeper
first, so the volume goes with it.

Blocking docker-py calls: DockerSandboxes runs them on its threads.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from docker.errors import APIError, NotFound
from docker.types import LogConfig, Mount

from .isolation import OFFLINE, confinement, small_container_memory
from .settings import RuntimeSettings

__all__ = [
    "KEEPER_PREFIX",
    "LABEL_KEEPS",
    "ROLE_KEEPER",
    "keeper_name",
    "remove_keeper",
    "remove_stray_keepers",
    "start_keeper",
    "workspace_volume",
]

log = logging.getLogger("deckhands.runtime.keepers")

KEEPER_PREFIX = "deckhands-keep-"
ROLE_KEEPER = "workspace-keeper"
LABEL_KEEPS = "deckhands.keeps"  # the id of the sandbox container whose workspace it keeps
WORKSPACE = "/workspace"


def keeper_name(container_id: str) -> str:
    return KEEPER_PREFIX + container_id[:12]


def _workspace_volume(api: Any, container_id: str) -> str:
    for mount in api.inspect_container(container_id).get("Mounts") or []:
        if mount.get("Destination") == WORKSPACE and mount.get("Type") == "volume":
            return str(mount["Name"])
    raise LookupError(f"sandbox {container_id[:12]} has no workspace volume")


def workspace_volume(api: Any, container_id: str) -> str:
    """The name of a sandbox's /workspace volume (LookupError if it has none)."""
    return _workspace_volume(api, container_id)


def start_keeper(
    api: Any, settings: RuntimeSettings, labels: dict[str, str], container_id: str
) -> None:
    """Start the keeper of a running sandbox's workspace (before the sandbox is stopped)."""
    volume = _workspace_volume(api, container_id)
    config = api.create_container_config(
        settings.sandbox_image,
        ["sleep", "infinity"],
        entrypoint=[],
        user="65534:65534",
        labels={**labels, LABEL_KEEPS: container_id},
        host_config=api.create_host_config(
            **confinement(
                settings,
                memory_bytes=small_container_memory(settings, 16 << 20),
                pids=8,
                init=False,
            ),
            mounts=[Mount(WORKSPACE, volume, type="volume", read_only=True)],
            network_mode="none",
            log_config=LogConfig(type="none"),
        ),
        **OFFLINE,
    )
    name = keeper_name(container_id)
    try:
        keeper = api.create_container_from_config(config, name)["Id"]
    except APIError as exc:
        if exc.status_code != 409:
            raise
        keeper = api.inspect_container(name)["Id"]  # one from an earlier, interrupted stop
    api.start(keeper)


def remove_keeper(api: Any, container_id: str) -> None:
    """Remove a sandbox's keeper, if it has one (its files then live only in the sandbox)."""
    try:
        api.remove_container(keeper_name(container_id), force=True)
    except NotFound:
        pass


def remove_stray_keepers(api: Any, role_filters: list[str], min_age_s: float) -> int:
    """Remove keepers no longer needed: their sandbox is gone or running again.

    Only keepers older than `min_age_s`: a keeper is started just before its sandbox stops.
    """
    removed = 0
    for raw in api.containers(all=True, filters={"label": role_filters}):
        if time.time() - float(raw.get("Created") or 0) < min_age_s:
            continue
        sandbox = (raw.get("Labels") or {}).get(LABEL_KEEPS, "")
        needed = False
        if sandbox:
            try:
                needed = not api.inspect_container(sandbox)["State"]["Running"]
            except NotFound:
                pass
        if not needed:
            try:
                api.remove_container(raw["Id"], force=True)
                removed += 1
            except NotFound:
                pass
            except APIError as exc:
                log.warning("could not remove workspace keeper %s: %s", raw["Id"][:12], exc)
    return removed
