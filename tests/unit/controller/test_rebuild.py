"""A State rebuilt from the task's log is the State the live controller had (issue 12, part 2).

Each test drives the pure loop as the controller does (apply, then remember the input), keeps
what it logged, and rebuilds from that log alone: field by field the same State, but for the
fields the log cannot tell (services/controller/rebuild.py says which, and why).
"""

from __future__ import annotations

import pytest
from live_log import TASK, Live, new_task  # type: ignore[import-not-found]

from services.controller.agent_loop import send_queued_action, sub_task_id
from services.controller.errors import RebuildError
from services.controller.metrics import STEPS
from services.controller.rebuild import rebuild_state, waits_for_a_seat
from services.controller.turn import Turn
from shared.commands import ExecuteAction
from shared.events import (
    AgentDelegateAction,
    AgentDelegateObservation,
    AgentFinishAction,
    AgentState,
    AgentThinkAction,
    AnswerMissingObservation,
    ChangeAgentStateAction,
    CmdRunAction,
    EventBase,
    EventSource,
    MessageAction,
    RiskLevel,
    SandboxQueuedObservation,
    SecurityVerdictObservation,
    SubTaskSpend,
    Verdict,
)
from shared.state import Awaiting, TaskState

# What the log cannot tell; each is checked on its own where it matters.
_NOT_LOGGED = {
    "version",
    "updated_at",
    "awaiting_attempt",
    "awaiting_deadline",
    "unseen_events",
    "unseen_bytes",
    "processed",
    "outboxes",
}


def _rebuilt(live: Live, next_input: EventBase | None = None) -> TaskState:
    # The log as the stream gives it back, in any order and with a republished copy.
    entries = [*reversed(live.log), live.log[len(live.log) // 2]]
    return rebuild_state(entries, next_input)


def assert_same(live: Live, rebuilt: TaskState) -> None:
    skip = set(_NOT_LOGGED)
    if live.state.awaiting is Awaiting.AGENT and rebuilt.awaiting_id != live.state.awaiting_id:
        # The step request in flight is not logged: no answer named it (mid-step tests below).
        assert rebuilt.awaiting_id is None
        skip.add("awaiting_id")
    want = live.state.model_dump(exclude=skip)
    got = rebuilt.model_dump(exclude=skip)
    assert got == want, {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert rebuilt.version == 0 and rebuilt.unseen_events is None and rebuilt.outboxes == {}
    assert set(rebuilt.processed) <= set(live.state.processed)
    assert rebuilt.updated_at == live.log[-1].timestamp


def test_a_finished_task() -> None:
    live = new_task()
    live.command("echo 'print(1)' > squares.py")
    live.command("python squares.py", "1\n")
    live.agent(
        AgentThinkAction(task_id=TASK, source=EventSource.AGENT, cause=live.step_id, thought="ok")
    )
    live.agent(
        AgentFinishAction(
            task_id=TASK,
            source=EventSource.AGENT,
            cause=live.step_id,
            final_message="done",
            outputs={"n": 1},
        )
    )
    assert live.state.agent_state is AgentState.FINISHED and live.state.finished_at is not None
    steps = STEPS._value.get()
    rebuilt = _rebuilt(live)
    assert STEPS._value.get() == steps  # the replay counts no step: they were counted live
    assert_same(live, rebuilt)
    assert rebuilt.result is not None and rebuilt.result.final_message == "done"
    assert (rebuilt.iteration, rebuilt.usage.llm_calls) == (4, 2)
    assert rebuilt.last_seq == len(live.log) and rebuilt.recent == live.state.recent


def test_mid_action_the_runtime_may_run_it_again() -> None:
    """The rebuilt State awaits the runtime's answer to the approved action: the order the
    runtime holds still passes its check, and the answer is applied when it comes."""
    live = new_task()
    live.command("ls")
    action = live.run("python squares.py")
    live.allow(action)
    rebuilt = _rebuilt(live)
    assert_same(live, rebuilt)
    assert (rebuilt.awaiting, rebuilt.awaiting_id) == (Awaiting.RUNTIME, action.id)
    assert rebuilt.approval is not None and rebuilt.approval.action_id == action.id
    assert rebuilt.pending_action == live.state.pending_action
    assert rebuilt.pending_action is not None and rebuilt.pending_action.id == action.id
    assert rebuilt.runtime_replica == "node-a"  # the replica holding the sandbox, from the log
    [order] = [m for _, m in live.turns[-1].sent if isinstance(m, ExecuteAction)]
    from services.runtime.order_check import refusal_of

    assert refusal_of(rebuilt, order) is None


def test_an_action_waiting_for_a_seat_is_sent_again() -> None:
    """The runtime kept the queued order in Redis: rebuilt, the task sends it again."""
    live = new_task()
    action = live.run("ls")
    live.allow(action)
    assert not waits_for_a_seat(live.log, _rebuilt(live))
    live.feed(
        SandboxQueuedObservation(
            task_id=TASK,
            source=EventSource.ENVIRONMENT,
            cause=action.id,
            position=2,
            max_sandboxes=4,
        )
    )
    rebuilt = _rebuilt(live)
    assert_same(live, rebuilt)
    assert waits_for_a_seat(live.log, rebuilt)
    turn = Turn(rebuilt)
    send_queued_action(turn)
    [(_, order)] = turn.sent
    assert isinstance(order, ExecuteAction) and order.action.id == action.id
    from services.runtime.order_check import refusal_of

    assert refusal_of(rebuilt, order) is None


def test_under_review() -> None:
    live = new_task()
    action = live.run("ls")
    rebuilt = _rebuilt(live)
    assert_same(live, rebuilt)
    assert (rebuilt.awaiting, rebuilt.awaiting_id) == (Awaiting.SECURITY, action.id)


def test_awaiting_confirmation_then_confirmed() -> None:
    live = new_task(confirmation_mode=True, confirmation_threshold=RiskLevel.MEDIUM)
    action = live.run("rm -rf build")
    live.allow(action, RiskLevel.HIGH)
    assert live.state.agent_state is AgentState.AWAITING_USER_CONFIRMATION
    rebuilt = _rebuilt(live)
    assert_same(live, rebuilt)
    assert (rebuilt.awaiting, rebuilt.awaiting_id) == (Awaiting.CONFIRMATION, action.id)

    live.feed(
        ChangeAgentStateAction(
            task_id=TASK,
            source=EventSource.USER,
            agent_state=AgentState.USER_CONFIRMED,
            cause=action.id,
        )
    )
    rebuilt = _rebuilt(live)
    assert_same(live, rebuilt)
    assert rebuilt.approval is not None and rebuilt.approval.by.value == "user"


def test_a_parent_waiting_for_its_sub_task_and_the_sub_task_itself() -> None:
    parent = new_task()
    delegate = AgentDelegateAction(
        task_id=TASK,
        source=EventSource.AGENT,
        cause=parent.step_id,
        task="write tests",
        max_iterations=4,
    )
    turn = parent.agent(delegate)
    [child_state] = turn.new_tasks
    rebuilt = _rebuilt(parent)
    assert_same(parent, rebuilt)
    assert (rebuilt.awaiting, rebuilt.sub_tasks) == (Awaiting.DELEGATE, [sub_task_id(delegate.id)])

    # The sub-task's own log rebuilds it with its parent, depth and share of the limits.
    child = Live(child_state)
    [(_, first)] = [(s, m) for s, m in turn.sent if isinstance(m, MessageAction)]
    child.feed(first)
    child.command("pytest")
    child.agent(
        AgentFinishAction(
            task_id=child_state.task_id, source=EventSource.AGENT, cause=child.step_id
        )
    )
    rebuilt_child = _rebuilt(child)
    assert_same(child, rebuilt_child)
    assert rebuilt_child.parent_task_id == TASK and rebuilt_child.delegation_depth == 1
    assert rebuilt_child.max_iterations == 4

    # The report reaches the parent: its spend counts, and the parent asks for its next step.
    [report] = [m for _, m in child.turns[-1].sent if isinstance(m, AgentDelegateObservation)]
    parent.feed(report)
    rebuilt = _rebuilt(parent)
    assert_same(parent, rebuilt)
    assert rebuilt.sub_task_spend[child_state.task_id] == SubTaskSpend(
        iterations=2, prompt_tokens=100, completion_tokens=7, cost_usd=0.01, llm_calls=1
    )


def test_mid_step_adopts_the_answer_that_comes() -> None:
    """A step request is not logged: the rebuilt State takes the first answer to a request the
    log does not name as the one it waits for, and without one it waits for a new request."""
    live = new_task()
    live.command("ls")
    step = live.step_id
    answer = CmdRunAction(task_id=TASK, source=EventSource.AGENT, cause=step, command="cat a")
    rebuilt = _rebuilt(live, answer)
    assert (rebuilt.awaiting, rebuilt.awaiting_id) == (Awaiting.AGENT, step)
    assert_same(live, rebuilt)
    assert _rebuilt(live).awaiting_id is None
    # A user's message is no answer to the step.
    note = MessageAction(task_id=TASK, source=EventSource.USER, content="also b")
    assert _rebuilt(live, note).awaiting_id is None
    # Nor an answer to something the log names (a late second output of the last action).
    late = live.log[-1].model_copy(update={"id": "late", "seq": None})
    assert _rebuilt(live, late).awaiting_id is None


def test_an_overdue_answer_that_ended_the_task_follows_the_log() -> None:
    """The overdue notice is not logged, only the ERROR it caused; the log has the last say."""
    live = new_task()
    live.run("sleep 1")  # under review, and the monitor never answers
    for attempt in range(3):
        live.feed(
            AnswerMissingObservation(
                task_id=TASK,
                source=EventSource.SYSTEM,
                cause=live.state.awaiting_id,
                why="overdue",
                awaiting="security",
                attempt=attempt,
            )
        )
    assert live.state.agent_state is AgentState.ERROR
    rebuilt = _rebuilt(live)
    assert_same(live, rebuilt)
    assert rebuilt.reason.startswith("no answer from the security monitor")


def test_denied_paused_rate_limited_stopped_and_resumed() -> None:
    live = new_task()
    action = live.run("curl evil")
    live.feed(
        SecurityVerdictObservation(
            task_id=TASK,
            source=EventSource.ENVIRONMENT,
            cause=action.id,
            verdict=Verdict.DENY,
            risk=RiskLevel.HIGH,
            rule="egress",
        )
    )
    live.feed(
        ChangeAgentStateAction(
            task_id=TASK,
            source=EventSource.SYSTEM,
            agent_state=AgentState.RATE_LIMITED,
            cause=live.step_id,
        )
    )
    assert live.state.agent_state is AgentState.RATE_LIMITED
    assert_same(live, _rebuilt(live))
    live.agent(
        MessageAction(task_id=TASK, source=EventSource.AGENT, cause=live.step_id, content="hm")
    )
    live.feed(
        ChangeAgentStateAction(task_id=TASK, source=EventSource.USER, agent_state=AgentState.PAUSED)
    )
    assert_same(live, _rebuilt(live))
    live.feed(
        ChangeAgentStateAction(
            task_id=TASK, source=EventSource.USER, agent_state=AgentState.RUNNING
        )
    )
    live.agent(AgentFinishAction(task_id=TASK, source=EventSource.AGENT, cause=live.step_id))
    live.feed(MessageAction(task_id=TASK, source=EventSource.USER, content="now also tests"))
    live.feed(
        ChangeAgentStateAction(
            task_id=TASK, source=EventSource.USER, agent_state=AgentState.STOPPED
        )
    )
    live.feed(
        MessageAction(task_id=TASK, source=EventSource.USER, content="refused: it is stopped")
    )
    assert live.state.agent_state is AgentState.STOPPED
    assert_same(live, _rebuilt(live))


def test_iteration_limit_reached_and_raised_by_a_message() -> None:
    live = new_task(max_iterations=2)
    live.command("a")
    live.command("b")
    assert live.state.agent_state is AgentState.ERROR
    assert_same(live, _rebuilt(live))
    live.feed(MessageAction(task_id=TASK, source=EventSource.USER, content="go on"))
    assert live.state.max_iterations == 12
    assert_same(live, _rebuilt(live))


def test_a_log_that_cannot_rebuild_is_refused() -> None:
    live = new_task()
    live.command("ls")
    with pytest.raises(RebuildError):
        rebuild_state([])
    with pytest.raises(RebuildError, match="no entry 3"):
        rebuild_state([e for e in live.log if e.seq != 3])
    with pytest.raises(RebuildError, match="creation"):
        rebuild_state([e.model_copy(update={"seq": (e.seq or 0) - 1}) for e in live.log[1:]])
