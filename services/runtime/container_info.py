"""What the Docker engine says about a container (a listing or an inspection), as one record."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .sandbox_labels import TASK_PREFIX

__all__ = ["ContainerInfo", "container_info"]


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    running: bool
    status: str
    labels: dict[str, str]
    oom_killed: bool = False
    exit_code: int | None = None
    created: float = 0.0  # unix time

    @property
    def age_s(self) -> float:
        return time.time() - self.created if self.created else 0.0

    @property
    def paused(self) -> bool:
        """Frozen (`docker pause`): an ended task's kept sandbox; not running, in our terms."""
        return self.status == "paused"

    @property
    def task_name(self) -> str | None:
        """`deckhands-task-<x>` for a bound sandbox, else None."""
        return self.name if self.name.startswith(TASK_PREFIX) else None


def container_info(raw: dict[str, Any]) -> ContainerInfo:
    # Both the list (Names, State str) and inspect (Name, State dict) shapes.
    if "Names" in raw:
        name = (raw.get("Names") or ["/"])[0].lstrip("/")
        state = raw.get("State") or ""
        return ContainerInfo(
            id=raw["Id"],
            name=name,
            running=state == "running",
            status=state,
            labels=raw.get("Labels") or {},
            created=float(raw.get("Created") or 0),
        )
    state_d = raw.get("State") or {}
    return ContainerInfo(
        id=raw["Id"],
        name=str(raw.get("Name", "")).lstrip("/"),
        # Docker calls a paused container running; it runs nothing, and must be unpaused first.
        running=bool(state_d.get("Running"))
        and not state_d.get("Restarting")
        and not state_d.get("Paused"),
        status=str(state_d.get("Status", "")),
        labels=(raw.get("Config") or {}).get("Labels") or {},
        oom_killed=bool(state_d.get("OOMKilled")),
        exit_code=state_d.get("ExitCode"),
    )
