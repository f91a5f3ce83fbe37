"""A rewind (issue 28, item 4): the task goes back to a seq of its log and on from there; the log
keeps what came after, out of the task's course; a State rebuilt from that log is the same."""

from __future__ import annotations

from live_log import TASK, Live, new_task  # type: ignore[import-not-found]

from services.controller.agent_loop import rewind
from services.controller.rebuild import rebuild_at, rebuild_state
from services.controller.turn import Turn
from shared.commands import ExecuteAction, StepRequest
from shared.events import (
    AgentFinishAction,
    AgentState,
    CmdRunAction,
    ErrorObservation,
    EventSource,
    RewindAction,
)
from shared.forks import files_at, in_course
from shared.state import Awaiting


def _rewind(live: Live, to: int) -> Turn:
    """The controller's rewind turn, as its handler runs it: the point from the log."""
    event = RewindAction(
        task_id=TASK, source=EventSource.USER, to=to, checkpoint=files_at(live.log, to).checkpoint
    )
    turn = Turn(live.state)
    rewind(turn, event, rebuild_at(live.log, to))
    turn.update(**turn.state.record_input(event.id, turn.outbox()))
    live.state = turn.state
    live.log += turn.logged
    return turn


def _finished() -> tuple[Live, CmdRunAction, CmdRunAction]:
    live = new_task()
    first = live.command("echo 1 > a")
    live.checkpoint(first)
    second = live.command("rm a; echo 2 > b")
    live.checkpoint(second)
    live.agent(
        AgentFinishAction(
            task_id=TASK, source=EventSource.AGENT, cause=live.step_id, final_message="done"
        )
    )
    assert live.state.agent_state is AgentState.FINISHED
    return live, first, second


def test_a_rewound_task_goes_on_from_the_point_and_its_log_keeps_the_rest() -> None:
    live, first, second = _finished()
    to = live.output_seq(first)
    before = len(live.log)
    iterations_at = rebuild_at(live.log, to)[0].iteration
    spent = live.state.usage.cost_usd

    turn = _rewind(live, to)

    marker = turn.logged[0]
    assert isinstance(marker, RewindAction) and marker.rewound_to == to
    assert marker.seq == before + 1  # nothing deleted: the rewind comes after it all
    state = live.state
    assert state.agent_state is AgentState.RUNNING and state.rewound_at == marker.seq
    assert state.iteration == iterations_at  # the point's, its next step asked again
    assert state.usage.cost_usd == spent  # what was spent stays spent
    assert (state.checkpoint_seq, state.checkpoint_task, state.restore_first) == (
        live.seq_of(first.id),
        None,
        True,
    )
    assert state.result is None and state.finished_at is None
    assert [m for _, m in turn.sent if isinstance(m, StepRequest)]
    # The course: up to the point, then the rewind; the second command is out of it.
    course = in_course(live.log)
    assert second.id not in {e.id for e in course}
    assert [e.seq for e in course] == [
        *range(1, to + 1),
        *range(marker.seq or 0, len(live.log) + 1),
    ]
    # Its files: the first command's checkpoint, until the next action's.
    assert files_at(live.log, len(live.log)).checkpoint == f"{TASK}/{live.seq_of(first.id)}"

    # The next action's order puts the files back first; its answer ends that.
    action = live.run("cat a")
    live.allow(action)
    order = next(m for _, m in live.turns[-1].sent if isinstance(m, ExecuteAction))
    assert order.restore_first and order.checkpoint_seq == live.seq_of(first.id)
    live.output(action, "1\n")
    assert live.state.restore_first is False
    # A late checkpoint of an action the rewind took out changes nothing.
    live.checkpoint(second)
    assert live.state.checkpoint_seq == live.seq_of(first.id)

    rebuilt = rebuild_state(live.log)
    for field in ("agent_state", "iteration", "checkpoint_seq", "rewound_at", "recent", "usage"):
        assert getattr(rebuilt, field) == getattr(live.state, field), field


def test_a_running_task_is_not_rewound() -> None:
    live = new_task()
    first = live.command("echo 1 > a")
    state = live.state
    turn = _rewind(live, live.output_seq(first))
    assert isinstance(turn.logged[0], RewindAction) and turn.logged[0].rewound_to is None
    refused = turn.logged[1]
    assert isinstance(refused, ErrorObservation) and "paused or ended" in refused.content
    assert live.state.agent_state is state.agent_state and live.state.awaiting is Awaiting.AGENT
    assert live.state.rewound_at is None and not turn.sent
