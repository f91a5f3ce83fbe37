"""What the runtime says of a task's files between its steps (issue 28): a checkpoint taken, an
upload written. Facts for the log, whatever the task awaits: they change nothing of its
course, only which checkpoint holds its files."""

from __future__ import annotations

from shared.commands import CheckpointWorkspace
from shared.events import WorkspaceCheckpointObservation, WorkspaceUploadedObservation
from shared.forks import parse_checkpoint
from shared.subjects import Service

from ..turn import Turn

__all__ = ["checkpointed", "uploaded"]


def checkpointed(turn: Turn, event: WorkspaceCheckpointObservation) -> None:
    """The runtime's checkpoint of the files after an action (or an upload, or the checkout),
    taken while the agent thinks."""
    turn.log(event)
    state = turn.state
    due = state.checkpoint_due
    if due is not None and event.action_seq >= due and event.skipped != "not_running":
        # The upload's files are kept (or why not is logged). Its sandbox not running, the
        # next action takes it first: until then every action carries the seq.
        turn.update(checkpoint_due=None)
    # One of an action a rewind took out of the task's course is not its files any more.
    newest = max(state.checkpoint_seq or 0, state.rewound_at or 0)
    if event.checkpoint and event.action_seq > newest:
        # A fork's log holds its parent's checkpoints: they are the parent's to read. An
        # upload that changed nothing names the checkpoint before it.
        owner, seq = parse_checkpoint(event.checkpoint)
        turn.update(checkpoint_seq=seq, checkpoint_task=None if owner == event.task_id else owner)


def uploaded(turn: Turn, event: WorkspaceUploadedObservation) -> None:
    """Files uploaded into the task's /workspace: logged, and their checkpoint asked for at
    that seq. Until it is logged, every action carries the seq (`checkpoint_due`): the runtime
    takes it before the action if the order has not reached it yet."""
    entry = turn.log(event)
    assert entry.seq is not None
    state = turn.state
    turn.update(checkpoint_due=entry.seq)
    turn.send(
        Service.RUNTIME,
        CheckpointWorkspace(
            task_id=state.task_id,
            seq=entry.seq,
            cause=entry.id,
            tenant_id=state.tenant_id,
            checkpoint_seq=state.checkpoint_seq,
            checkpoint_task=state.checkpoint_task,
        ),
    )
