"""The runtime's workspace checkpoints in the log (issue 28): each is logged as it comes,
whatever the task awaits, the task's orders then name the last one taken (a skipped one does
not count), and a State rebuilt from the log names the same one."""

from __future__ import annotations

from loop_steps import TASK, executed, started  # type: ignore[import-not-found]

from services.controller.agent_loop import apply
from services.controller.rebuild import rebuild_state
from services.controller.turn import Turn
from shared.events import EventSource, MessageAction, WorkspaceCheckpointObservation
from shared.state import TaskState


def _checkpoint(action_seq: int, skipped: str = "") -> WorkspaceCheckpointObservation:
    return WorkspaceCheckpointObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        cause=f"action-{action_seq}",
        action_seq=action_seq,
        checkpoint="" if skipped else f"{TASK}/{action_seq}",
        files=10,
        bytes=1000,
        skipped=skipped,  # type: ignore[arg-type]
    )


def test_a_checkpoint_is_logged_between_steps_and_named_by_the_next_orders() -> None:
    state, step, _ = started(TaskState(task_id=TASK, task="do it", max_iterations=5))
    assert executed(state, step).checkpoint_seq is None
    turn = Turn(state)
    taken = _checkpoint(4)
    apply(turn, taken)
    assert [e.id for e in turn.logged] == [taken.id] and not turn.sent
    assert turn.state.checkpoint_seq == 4
    assert turn.state.awaiting_id == step.id  # the step asked for is still the one awaited
    assert executed(turn.state, step).checkpoint_seq == 4

    # A skipped one is logged (the log says why) but names no files; an older one that came
    # late does not go back.
    later = Turn(turn.state)
    apply(later, _checkpoint(6, skipped="too_large"))
    apply(later, _checkpoint(2))
    assert len(later.logged) == 2 and later.state.checkpoint_seq == 4


def test_a_state_rebuilt_from_the_log_names_the_same_checkpoint() -> None:
    first = Turn(TaskState(task_id=TASK, task="do it", max_iterations=5))
    apply(first, MessageAction(task_id=TASK, source=EventSource.USER, content="do it"))
    turn = Turn(first.state)
    apply(turn, _checkpoint(3))
    rebuilt = rebuild_state([*first.logged, *turn.logged])
    assert rebuilt.checkpoint_seq == 3 and rebuilt.last_seq == turn.state.last_seq
