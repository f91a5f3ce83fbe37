"""A sandbox the runtime holds: a running container whose executor answered, attached."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shared.egress_policy import SandboxEgress
from shared.sandbox_protocol.session import SandboxSession

from .sandbox_labels import NO_NETWORK
from .sandbox_shape import SandboxShape

__all__ = ["Sandbox"]


@dataclass
class Sandbox:
    """A running container with a healthy executor we are attached to."""

    container_id: str
    name: str
    session: SandboxSession
    created_at: float = field(default_factory=time.monotonic)
    task_id: str | None = None
    network: str = NO_NETWORK
    # A /workspace quota of its task's own (None: the pool's default size).
    workspace_bytes: int | None = None
    # Its task's network policy: no network, only the egress proxy's folder.
    egress: SandboxEgress | None = None
    # Its folder's name under DECKHANDS_EGRESS_DIR (egress_folders.py), if it has one.
    egress_token: str | None = None
    # Told to the agent with its next command's output (e.g. the sandbox was restarted).
    notice: str | None = None
    # Bound to its task afresh: if the task has a checkpoint, its files are restored from it
    # before the task's next action (its earlier sandbox is gone; checkpoint_restore.py).
    fresh: bool = False

    @property
    def shape(self) -> SandboxShape:
        return SandboxShape(self.network, self.workspace_bytes, self.egress)

    @property
    def short_id(self) -> str:
        return self.container_id[:12]

    @property
    def lost(self) -> bool:
        return self.session.lost_reason is not None
