"""The checkpoint settings (issue 28), a part of RuntimeSettings (settings.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["CheckpointSettings"]


class CheckpointSettings(BaseModel):
    checkpoints: bool = Field(
        default=True,
        description="After every action that can change files (a command, a Python cell, a "
        "write, an edit), record /workspace as a checkpoint in the checkpoint store, while the "
        "agent thinks (the next action waits only if it is not done): a fork or a restore "
        "starts from it. False: none is taken.",
    )
    checkpoint_max_files: int = Field(
        default=200_000,
        ge=1,
        description="A workspace with more paths than this is not checkpointed (the log says "
        "so with `too_large`; the action is not affected).",
    )
    checkpoint_max_workspace_bytes: int = Field(
        default=2 << 30,
        ge=1,
        description="A workspace whose files hold more bytes than this is not checkpointed "
        "(`too_large`).",
    )
    checkpoint_task_max_bytes: int = Field(
        default=4 << 30,
        ge=1,
        description="Bytes a task's checkpoints may take in the store, all together; past it "
        "its checkpoints are skipped (`quota`).",
    )
    checkpoint_tenant_max_bytes: int = Field(
        default=64 << 30,
        ge=1,
        description="Bytes the checkpoints of all of a tenant's tasks may take in the store; "
        "past it they are skipped (`quota`).",
    )
    checkpoint_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="The longest a checkpoint may take; then it is recorded as failed and the "
        "next action goes on.",
    )
    checkpoint_retention_s: float = Field(
        default=7 * 86400.0,
        ge=0,
        description="A task's checkpoints are removed once its last one is this old (forks and "
        "restores from them are no longer possible); 0 keeps them until the task is deleted.",
    )
    checkpoint_sweep_interval_s: float = Field(
        default=600.0,
        gt=0,
        description="How often each runtime replica looks for checkpoints past their retention.",
    )
