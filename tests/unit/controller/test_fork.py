"""A fork's first turn (issue 28, item 2): the parent's log copied to the point, the State rebuilt
there, the files named, and the fork sent on its way; and which files a point has."""

from __future__ import annotations

from datetime import UTC, datetime

from live_log import TASK, Live, new_task  # type: ignore[import-not-found]

from services.controller.fork import fork_turn
from shared.commands import StepRequest
from shared.events import (
    AgentFinishAction,
    AgentState,
    AgentStateChangedObservation,
    CmdRunAction,
    EventSource,
    MessageAction,
    TaskCreatedObservation,
)
from shared.forks import files_at
from shared.state import Awaiting
from shared.subjects import EVENTS_STREAM, NOTICES_STREAM

FORK = "t-fork"


def _request(at: int, checkpoint: str | None, message: str = "") -> TaskCreatedObservation:
    return TaskCreatedObservation(
        id=f"created-{FORK}",
        task_id=FORK,
        source=EventSource.SYSTEM,
        created_at=datetime(2026, 11, 28, tzinfo=UTC),
        max_iterations=10,
        initial_max_iterations=10,
        forked_from=TASK,
        forked_at=at,
        fork_checkpoint=checkpoint,
        task=message,
    )


def _two_commands() -> tuple[Live, CmdRunAction, CmdRunAction]:
    live = new_task()
    first = live.command("echo 1 > a")
    live.checkpoint(first)
    second = live.command("echo 2 > b")
    live.checkpoint(second)
    return live, first, second


def test_a_fork_copies_the_log_to_the_point_and_asks_for_the_next_step() -> None:
    live, first, _ = _two_commands()
    at = live.output_seq(first)
    files = files_at(live.log, at)
    assert files.checkpoint == f"{TASK}/{live.seq_of(first.id)}" and files.unkept is None

    turn = fork_turn(_request(at, files.checkpoint), live.log, 2)

    logged = turn.logged
    assert logged[0].seq == 1 and logged[0].inherited_from is None
    assert isinstance(logged[0], TaskCreatedObservation) and logged[0].forked_from == TASK
    copies = [e for e in logged if e.inherited_from == TASK]
    assert [e.seq for e in copies] == list(range(2, at + 1))
    assert all(e.task_id == FORK for e in logged)
    parents = [e for e in live.log if 1 < (e.seq or 0) <= at]
    assert [(e.seq, type(e)) for e in copies] == [(e.seq, type(e)) for e in parents]
    assert not {e.id for e in copies} & {e.id for e in parents}  # ids are one log's own
    ids = {e.id for e in copies}
    assert all(e.cause in ids for e in copies if e.cause and e.source is not EventSource.AGENT)
    state = turn.state
    assert (state.task_id, state.last_seq, state.forked_from, state.forked_at) == (
        FORK,
        at,
        TASK,
        at,
    )
    assert (state.checkpoint_task, state.checkpoint_seq) == (TASK, live.seq_of(first.id))
    assert state.task == live.state.task and state.runtime_replica is None
    assert state.awaiting is Awaiting.AGENT and state.awaiting_id is not None
    steps = [m for _, m in turn.sent if isinstance(m, StepRequest)]
    assert len(steps) == 1 and steps[0].task_id == FORK and steps[0].after_seq == at
    outbox = turn.outbox()
    logged_ids = [m.msg_id for m in outbox if m.stream == EVENTS_STREAM]
    assert len(set(logged_ids)) == len(logged_ids)
    assert not [m for m in outbox if m.stream == NOTICES_STREAM]  # nothing new to notify


def test_a_point_on_an_action_in_flight_is_the_step_before_it() -> None:
    live, first, _ = _two_commands()
    third = live.run("rm a")
    live.allow(third)  # running: awaiting the runtime
    at = live.seq_of(third.id) + 1
    turn = fork_turn(_request(at, f"{TASK}/{live.seq_of(first.id)}"), live.log, 2)
    assert turn.state.last_seq < live.seq_of(third.id)
    assert turn.state.pending_action is None and turn.state.awaiting is Awaiting.AGENT
    assert turn.state.last_seq == max(e.seq or 0 for e in turn.logged)
    assert [m for _, m in turn.sent if isinstance(m, StepRequest)]


def test_a_message_resumes_a_finished_parent_in_the_fork() -> None:
    live, _, second = _two_commands()
    live.agent(
        AgentFinishAction(
            task_id=TASK, source=EventSource.AGENT, cause=live.step_id, final_message="done"
        )
    )
    end = live.log[-1].seq
    assert end is not None and live.state.agent_state is AgentState.FINISHED
    turn = fork_turn(_request(end, f"{TASK}/{live.seq_of(second.id)}", "now try X"), live.log, 2)
    own = [e for e in turn.logged if e.inherited_from is None and e.seq and e.seq > 1]
    assert isinstance(own[0], MessageAction) and own[0].content == "now try X"
    assert own[0].seq == end + 1
    assert isinstance(own[1], AgentStateChangedObservation)
    assert own[1].agent_state is AgentState.RUNNING
    assert turn.state.agent_state is AgentState.RUNNING and turn.state.result is not None
    assert [m for _, m in turn.sent if isinstance(m, StepRequest)]
    notices = [m for m in turn.outbox() if m.stream == NOTICES_STREAM]
    assert len(notices) == 1  # the fork's own RUNNING, not the parent's inherited FINISHED

    quiet = fork_turn(_request(end, None), live.log, 2)
    assert quiet.state.agent_state is AgentState.FINISHED and not quiet.sent


def test_files_at_a_point_are_those_of_the_actions_answered_by_then() -> None:
    live, first, second = _two_commands()
    # Before the second command's output: the first's checkpoint, though logged later.
    assert files_at(live.log, live.seq_of(second.id)).checkpoint == (
        f"{TASK}/{live.seq_of(first.id)}"
    )
    assert files_at(live.log, 2).checkpoint is None  # no action yet: an empty /workspace
    third = live.command("dd if=/dev/zero of=big")
    live.checkpoint(third, skipped="too_large")
    after = files_at(live.log, live.output_seq(third))
    assert after.unkept is not None and after.unkept.action_seq == live.seq_of(third.id)
    assert files_at(live.log, live.output_seq(second)).unkept is None


def test_a_fork_of_a_fork_keeps_where_each_entry_and_file_came_from() -> None:
    live, first, _ = _two_commands()
    at = live.output_seq(first)
    child = fork_turn(_request(at, f"{TASK}/{live.seq_of(first.id)}"), live.log, 2)
    # The grandchild forks the child at its last inherited seq.
    grand = TaskCreatedObservation(
        id="created-t-grand",
        task_id="t-grand",
        source=EventSource.SYSTEM,
        created_at=datetime(2026, 11, 28, tzinfo=UTC),
        max_iterations=10,
        forked_from=FORK,
        forked_at=at,
        fork_checkpoint=files_at(child.logged, at).checkpoint,
        task="",
    )
    turn = fork_turn(grand, child.logged, 2)
    assert {e.inherited_from for e in turn.logged[1:]} == {TASK}
    assert turn.state.checkpoint_task == TASK  # the files are still the grandparent's
