"""A checkpoint of a task's /workspace, as its log records it (issue 28)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import EventBase

__all__ = [
    "CHECKPOINT_SKIPPED_REASONS",
    "RewindAction",
    "WorkspaceCheckpointObservation",
    "WorkspaceUploadedObservation",
]

# Why a checkpoint was not taken; the action itself never fails for it.
CHECKPOINT_SKIPPED_REASONS = (
    "too_large",  # the workspace has more files or bytes than a checkpoint keeps
    "quota",  # the task's or its tenant's checkpoint bytes are used up
    "store_full",  # the checkpoint store is full
    "failed",  # the sandbox or the store did not answer
    "not_running",  # an upload's: the task's sandbox was not running (kept after the task ended)
)


class WorkspaceCheckpointObservation(EventBase):
    """The files of /workspace after the action `cause` (at seq `action_seq`) ran, recorded by
    the runtime while the agent thinks about its next step. A fork or a restore of the task at
    a later seq starts from the files of the last checkpoint it names. With `skipped`, none was
    taken (and why): the task goes on, a later checkpoint covers the files again. Never shown
    to the model."""

    kind: Literal["workspace_checkpoint"] = "workspace_checkpoint"
    action_seq: int = Field(
        ge=1,
        description="The seq of the entry whose files these are: an action's, an upload's "
        "(workspace_uploaded), or 1 (the task's creation) for its repository's checkout.",
    )
    checkpoint: str = Field(
        default="",
        max_length=200,
        description="Its id in the checkpoint store ('<task>/<seq>'; an upload that changed "
        "nothing names the one before); '' if skipped.",
    )
    base_seq: int | None = Field(
        default=None, description="The checkpoint it adds to (None: a whole one)."
    )
    files: int = Field(ge=0, description="Paths in /workspace (files, folders and links).")
    bytes: int = Field(ge=0, description="Bytes of all files in /workspace.")
    changed: int = Field(default=0, ge=0, description="Paths new, changed or removed.")
    stored_bytes: int = Field(
        default=0, ge=0, description="Bytes this checkpoint added to the store."
    )
    skipped_paths: int = Field(
        default=0, ge=0, description="Unreadable paths, names not UTF-8, fifos, sockets."
    )
    took_ms: float = Field(default=0.0, ge=0)
    skipped: Literal["", "too_large", "quota", "store_full", "failed", "not_running"] = Field(
        default="", description="Why no checkpoint was taken ('' when one was)."
    )
    detail: str = Field(default="", max_length=500, description="What the skip means.")


class WorkspaceUploadedObservation(EventBase):
    """Files a person uploaded into the task's /workspace (PUT .../workspace), as the runtime
    wrote them: the log's mark of the change, so that a fork or a rewind at this seq or later
    starts with them (the runtime takes a checkpoint here). Never shown to the model."""

    kind: Literal["workspace_uploaded"] = "workspace_uploaded"
    path: str = Field(
        default="", max_length=4096, description="Where under /workspace ('' for its root)."
    )
    files: int = Field(ge=0, description="Paths the upload wrote.")
    format: Literal["tar", "zip", "file"] = Field(description="What was uploaded.")


class RewindAction(EventBase):
    """A person's rewind of a paused or ended task to seq `to` (issue 28, item 4): a fork in
    place. Nothing is deleted: the entries after the point stay in the log, out of the task's
    course (the agent's history, the stuck detector and the files no longer hold them), and
    the task goes on from there, its /workspace back to the files of then."""

    kind: Literal["rewind"] = "rewind"
    to: int = Field(ge=1, description="The seq asked for.")
    checkpoint: str | None = Field(
        default=None,
        max_length=200,
        description="The checkpoint holding the files of that point ('<task>/<seq>'); None: "
        "an empty /workspace (no action had changed files by then).",
    )
    rewound_to: int | None = Field(
        default=None,
        description="As logged: the seq the task went back to (the end of the turn holding "
        "`to`, or the step before an action in flight there); what follows it up to this "
        "entry is out of the task's course.",
    )
