"""Where in a task's log a checkpoint belongs, and what the runtime knows of the task's files
there: after an action (its ExecuteAction), after its repository's checkout (the task's
creation, seq 1), after an upload (the upload's own entry, CheckpointWorkspace); and the
entries that say a checkpoint was not taken, or that an upload changed nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass

from shared.commands import CheckpointWorkspace, ExecuteAction
from shared.events import (
    ApplyPatchAction,
    CmdRunAction,
    EventSource,
    FileEditAction,
    FileWriteAction,
    RunPythonAction,
    WorkspaceCheckpointObservation,
)
from shared.sandbox_protocol.messages import ScanReply

__all__ = [
    "CHECKOUT_SEQ",
    "CheckpointPoint",
    "Skip",
    "changes_files",
    "skipped_entry",
    "unchanged_entry",
]

# A repository's checkout is the workspace the task was created with: its checkpoint belongs
# to the log's first entry (TaskCreatedObservation, always seq 1).
CHECKOUT_SEQ = 1


def changes_files(command: ExecuteAction) -> bool:
    action = command.action
    if isinstance(action, FileEditAction):
        return action.command != "view"
    return isinstance(action, CmdRunAction | RunPythonAction | FileWriteAction | ApplyPatchAction)


@dataclass(frozen=True)
class CheckpointPoint:
    task_id: str
    seq: int  # the log entry whose files the checkpoint holds
    cause: str | None  # that entry's id (an action's), None for the checkout
    tenant_id: str | None
    checkpoint_seq: int | None = None  # the last checkpoint the log names
    checkpoint_task: str | None = None  # whose it is, when not the task's own (a fork's parent)
    restore_first: bool = False  # rewound: the files go back to `checkpoint_seq` first
    anchor: bool = False  # not an action: logged even when nothing changed

    @classmethod
    def after_action(cls, command: ExecuteAction) -> CheckpointPoint:
        assert command.action.seq is not None
        return cls(
            task_id=command.task_id,
            seq=command.action.seq,
            cause=command.action.id,
            tenant_id=command.tenant_id,
            checkpoint_seq=command.checkpoint_seq,
            checkpoint_task=command.checkpoint_task,
            restore_first=command.restore_first,
        )

    @classmethod
    def due_before(cls, command: ExecuteAction) -> CheckpointPoint | None:
        """The checkpoint of an upload logged before the action (`checkpoint_due`) that this
        replica has not been asked for yet: taken before the action runs."""
        if command.checkpoint_due is None:
            return None
        return cls(
            task_id=command.task_id,
            seq=command.checkpoint_due,
            cause=None,
            tenant_id=command.tenant_id,
            checkpoint_seq=command.checkpoint_seq,
            checkpoint_task=command.checkpoint_task,
            anchor=True,
        )

    @classmethod
    def after_upload(cls, order: CheckpointWorkspace) -> CheckpointPoint:
        return cls(
            task_id=order.task_id,
            seq=order.seq,
            cause=order.cause,
            tenant_id=order.tenant_id,
            checkpoint_seq=order.checkpoint_seq,
            checkpoint_task=order.checkpoint_task,
            anchor=True,
        )

    @classmethod
    def after_checkout(cls, task_id: str, tenant_id: str | None) -> CheckpointPoint:
        return cls(task_id=task_id, seq=CHECKOUT_SEQ, cause=None, tenant_id=tenant_id, anchor=True)


class Skip(Exception):
    """No checkpoint is taken, for `reason` (CHECKPOINT_SKIPPED_REASONS)."""

    def __init__(self, reason: str, detail: str, files: int = 0, size: int = 0) -> None:
        super().__init__(detail)
        self.reason, self.detail, self.files, self.size = reason, detail, files, size


def skipped_entry(
    point: CheckpointPoint, skip: Skip, started: float
) -> WorkspaceCheckpointObservation:
    return WorkspaceCheckpointObservation(
        task_id=point.task_id,
        source=EventSource.ENVIRONMENT,
        cause=point.cause,
        action_seq=point.seq,
        files=skip.files,
        bytes=skip.size,
        took_ms=(time.monotonic() - started) * 1000,
        skipped=skip.reason,  # type: ignore[arg-type]
        detail=skip.detail[:500],
    )


def unchanged_entry(
    point: CheckpointPoint, holder: str, scan: ScanReply, started: float
) -> WorkspaceCheckpointObservation | None:
    """Nothing changed since the checkpoint `holder`: an action needs no entry, an upload's
    says which checkpoint holds its files (a fork at it starts from that one)."""
    if not point.anchor or holder.endswith("/0"):
        return None
    return WorkspaceCheckpointObservation(
        task_id=point.task_id,
        source=EventSource.ENVIRONMENT,
        cause=point.cause,
        action_seq=point.seq,
        checkpoint=holder,
        files=scan["files"],
        bytes=scan["bytes"],
        took_ms=(time.monotonic() - started) * 1000,
    )
