"""What TaskService takes and gives: a new task as a client asks for it, the server's defaults, a
task created or found; and which ids can name a task."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.egress_policy import EgressPolicy
from shared.events import RiskLevel, TaskPriority
from shared.state import TaskState

from ..webhooks.models import WebhookSpec
from .records import TaskRecord

__all__ = ["CreatedTask", "NewTask", "OwnedTask", "TaskDefaults", "valid_task_id"]

_TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def valid_task_id(task_id: str) -> bool:
    """Ids the gateway could have issued; anything else cannot name a task (or a subject token)."""
    return bool(_TASK_ID.fullmatch(task_id))


@dataclass(frozen=True)
class NewTask:
    """What a client asks for; None means the server's default."""

    task: str
    max_iterations: int | None = None
    max_budget_usd: float | None = None
    confirmation_mode: bool | None = None
    confirmation_threshold: RiskLevel | None = None
    network_egress: bool = False  # the task's policy is its tenant's whole bound (tasks/egress.py)
    network_allow: tuple[str, ...] = ()  # egress rules the task asks for, normalized
    network_presets: tuple[str, ...] = ()  # and the operator's presets it names
    network_between_actions: tuple[str, ...] = ()  # and what of them holds between actions
    workspace_mib: int | None = None  # the /workspace quota; None: the runtime's default
    trajectory: list[dict[str, Any]] | None = None
    labels: tuple[str, ...] = ()
    repository: dict[str, Any] | None = None  # the fields of a RepositorySpec (issue 11)
    secrets: tuple[str, ...] = ()  # the tenant's secrets its commands get (issue 11)
    webhook: WebhookSpec | None = None  # else the tenant's default
    priority: TaskPriority = TaskPriority.INTERACTIVE


@dataclass(frozen=True)
class TaskDefaults:
    """The server's defaults for a task. Its budget, delegation limits and whether it may be
    a replay are the tenant's quotas (services.gateway.quotas)."""

    max_iterations: int = 30
    confirmation_mode: bool = False
    confirmation_threshold: RiskLevel = RiskLevel.HIGH
    network_egress_allowed: bool = False
    max_workspace_mib: int = 8192
    egress_presets: Mapping[str, EgressPolicy] = field(default_factory=dict)


@dataclass(frozen=True)
class CreatedTask:
    state: TaskState
    replayed: bool  # an earlier request with the same Idempotency-Key made this task


@dataclass(frozen=True)
class OwnedTask:
    """A task the caller may see: its State and, for a task created through the API (not a
    sub-task), the gateway's record of it."""

    state: TaskState
    record: TaskRecord | None

    @property
    def labels(self) -> tuple[str, ...]:
        return () if self.record is None else self.record.labels
