"""Which files a fork starts with (issue 28, item 2): the gateway checks them before it accepts
a fork, and names them in the fork's creation request; the controller's fork starts from them.

A fork at seq N starts with the files as they were when the log reached N: after every action
the runtime had answered by then, none of those it had not. The runtime took a checkpoint after
each action that changed files (WorkspaceCheckpointObservation, logged while the agent thought,
so possibly after N; a fork's own log names the checkpoint it started from in its creation
entry); the newest checkpoint of an action answered by N holds those files,
unless a later such action's checkpoint was skipped (too large, over quota, failed): then the
files of N were never kept, and the fork is refused rather than started from older files.
Files change outside the actions too: a repository's checkout is checkpointed at seq 1 (the
workspace the task was created with), an upload at its own entry (workspace_uploaded).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from .events import (
    RUNNABLE_ACTION_TYPES,
    AgentState,
    EventBase,
    RewindAction,
    RuntimeAnswer,
    TaskCreatedObservation,
    WorkspaceCheckpointObservation,
    WorkspaceUploadedObservation,
)
from .subjects import CHECKPOINTS_BUCKET

__all__ = [
    "REWINDABLE",
    "ForkFiles",
    "checkpoint_kept",
    "checkpoint_name",
    "files_at",
    "in_course",
    "manifest_object",
    "parse_checkpoint",
]


# The states a task may be rewound from: a stopped task stays stopped (fork it instead), a
# running one is paused first.
REWINDABLE = frozenset(
    {AgentState.PAUSED, AgentState.FINISHED, AgentState.ERROR, AgentState.REJECTED}
)


def checkpoint_name(task_id: str, seq: int) -> str:
    """A checkpoint's id, as WorkspaceCheckpointObservation.checkpoint names it."""
    return f"{task_id}/{seq}"


def parse_checkpoint(name: str) -> tuple[str, int]:
    """(task, action seq) of a checkpoint id; ValueError if it is not one."""
    task_id, _, seq = name.rpartition("/")
    if not task_id or not seq.isdigit():
        raise ValueError(f"not a checkpoint id: {name!r}")
    return task_id, int(seq)


@dataclass(frozen=True)
class ForkFiles:
    """The files of a task's log at some seq."""

    checkpoint: str | None  # the checkpoint holding them; None: no action had changed files
    ran_to: int  # the seq of the last action the runtime had answered (0: none)
    unkept: WorkspaceCheckpointObservation | None = None  # a skipped checkpoint after it
    pending: int | None = None  # an upload after it whose checkpoint is not logged yet


def in_course(entries: Sequence[EventBase], upto: int | None = None) -> list[EventBase]:
    """The entries still in the task's course at seq `upto` (the log's end if None), in seq
    order: each rewind logged by then takes out what came after the seq it went back to, up to
    itself (the rewind stays, as the mark of it)."""
    ordered = sorted(
        (e for e in entries if e.seq is not None and (upto is None or e.seq <= upto)),
        key=lambda e: e.seq or 0,
    )
    course: list[EventBase] = []
    for entry in ordered:
        if isinstance(entry, RewindAction) and entry.rewound_to is not None:
            back = entry.rewound_to
            course = [e for e in course if (e.seq or 0) <= back]
        course.append(entry)
    return course


def files_at(entries: Sequence[EventBase], at: int) -> ForkFiles:
    """The files of the log `entries` (a task's whole log; checkpoints may be logged after
    `at`) at seq `at`."""
    course = in_course(entries, at)
    kept_seqs = {e.seq for e in course}
    answered = {e.cause for e in course if isinstance(e, RuntimeAnswer) and e.cause}
    ran = [e.seq for e in course if isinstance(e, RUNNABLE_ACTION_TYPES) and e.id in answered]
    ran_to = max((s for s in ran if s is not None), default=0)
    # The files changed outside the actions too: by the repository's checkout (the workspace
    # the task was created with, checkpointed at seq 1) and by uploads (at their entry).
    uploads = [e.seq or 0 for e in course if isinstance(e, WorkspaceUploadedObservation)]
    anchors = {1, *uploads}
    checkpoints = sorted(
        (
            e
            for e in entries
            if isinstance(e, WorkspaceCheckpointObservation)
            and (e.action_seq <= ran_to or e.action_seq in anchors)
            and e.action_seq in kept_seqs
        ),
        key=lambda e: e.action_seq,
    )
    # Where the files came from, by when: a checkpoint after its action; a fork's parent's
    # checkpoint (its own log may not hold it: its creation entry names it), at that action;
    # a rewind's, at the rewind (None: an empty /workspace).
    found: list[tuple[int, str | None]] = [
        (c.action_seq, c.checkpoint) for c in checkpoints if c.checkpoint
    ]
    base = next((e.fork_checkpoint for e in course if isinstance(e, TaskCreatedObservation)), None)
    if base is not None:
        seq = parse_checkpoint(base)[1]
        if (seq <= ran_to or seq in anchors) and seq in kept_seqs:
            found.append((seq, base))
    found += [(e.seq or 0, e.checkpoint) for e in course if isinstance(e, RewindAction)]
    last = max(found, key=lambda f: f[0]) if found else None
    after = last[0] if last is not None else 0
    unkept = next((c for c in reversed(checkpoints) if c.skipped and c.action_seq > after), None)
    taken = {c.action_seq for c in checkpoints}
    pending = next((u for u in reversed(uploads) if u > after and u not in taken), None)
    return ForkFiles(
        checkpoint=last[1] if last is not None else None,
        ran_to=ran_to,
        unkept=unkept,
        pending=pending,
    )


def _upto(entry: EventBase, at: int) -> bool:
    return entry.seq is not None and entry.seq <= at


def manifest_object(task_id: str, seq: int) -> str:
    """The object holding the manifest of `task_id`'s checkpoint after seq `seq`."""
    return f"{task_id}/m/{seq}"


async def checkpoint_kept(js: JetStreamContext, checkpoint: str) -> bool:
    """Whether the checkpoint store still holds `checkpoint` (its manifest's metadata, read
    with one message get: the reader needs no more than that permission)."""
    task_id, seq = parse_checkpoint(checkpoint)
    name = base64.urlsafe_b64encode(manifest_object(task_id, seq).encode()).decode()
    try:
        msg = await js.get_last_msg(
            f"OBJ_{CHECKPOINTS_BUCKET}", f"$O.{CHECKPOINTS_BUCKET}.M.{name}"
        )
    except NotFoundError:
        return False
    try:
        return not json.loads(msg.data or b"{}").get("deleted", False)
    except ValueError:
        return False
