"""What can go wrong in the runtime: every exception of its own derives from RuntimeServiceError
(not RuntimeError: that is Python's own)."""

from __future__ import annotations

# A call on a sandbox fails in the two ways the sandbox contract names, shared with its doubles.
from shared.sandbox_protocol.session import ExecutorError, SandboxLost

__all__ = [
    "ArchiveRefused",
    "ArchiveTooLarge",
    "CheckoutFailed",
    "ExecutorError",
    "HeldElsewhere",
    "HelperTimeout",
    "PoolExhausted",
    "RuntimeServiceError",
    "SandboxLost",
    "SandboxStartError",
    "StateBeingRebuilt",
    "WorkspaceLost",
]


class RuntimeServiceError(Exception):
    """The root of the runtime's own exceptions: a sandbox, its executor, a workspace or an
    order that could not be served as asked."""


# --- sandboxes and their executors ------------------------------------------------------------


class SandboxStartError(RuntimeServiceError):
    """A sandbox could not be created or its executor never answered."""


class PoolExhausted(RuntimeServiceError):
    """No sandbox became available within `acquire_timeout_s` (the pool is at max_total)."""


class WorkspaceLost(RuntimeServiceError):
    """The task's sandbox died or vanished; its files and sessions are gone."""


class HeldElsewhere(RuntimeServiceError):
    """The task's sandbox is held by another replica, which is alive: its orders go there."""

    def __init__(self, task_id: str, replica: str) -> None:
        super().__init__(f"task {task_id}: its sandbox is held by runtime replica {replica}")
        self.task_id = task_id
        self.replica = replica


# --- orders -----------------------------------------------------------------------------------


class StateBeingRebuilt(RuntimeServiceError):
    """Redis lost the task's State and the controller has not rebuilt it yet: the order is
    tried again later (a retryable failure, not a dead letter)."""


# --- workspaces -------------------------------------------------------------------------------


class CheckoutFailed(RuntimeServiceError):
    """The repository could not be fetched or checked out; the message says why."""


class HelperTimeout(RuntimeServiceError):
    """The helper did not finish in time (it was killed)."""


class ArchiveRefused(RuntimeServiceError, ValueError):
    """The upload or the path cannot go into a workspace (the message says why)."""


class ArchiveTooLarge(RuntimeServiceError, ValueError):
    """Past a size or file-count limit."""
