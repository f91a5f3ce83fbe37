"""Replay: which recorded action answers a step, and what it looks like once replayed."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from services.reasoner.replay import recorded_actions, replay_index, replayed_action
from services.reasoner.replies import step_event_id
from shared.commands import StepRequest
from shared.events import (
    AgentFinishAction,
    AgentState,
    AgentStateChangedObservation,
    AgentThinkAction,
    ChangeAgentStateAction,
    CmdOutputObservation,
    CmdRunAction,
    CondensationAction,
    ErrorObservation,
    EventSource,
    FileWriteAction,
    FileWriteObservation,
    LLMUsage,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)

OLD, NEW = "recorded-task", "replaying-task"
USER, AGENT, ENV, SYSTEM = (
    EventSource.USER,
    EventSource.AGENT,
    EventSource.ENVIRONMENT,
    EventSource.SYSTEM,
)
USAGE = LLMUsage(model="openai/gpt-4o-mini", prompt_tokens=900, completion_tokens=40, cost_usd=0.01)
LONG_AGO = datetime(2024, 1, 1, tzinfo=UTC)


def _recording() -> list[dict[str, Any]]:
    """An exported trajectory: every event of a finished task, as JSON objects."""
    write = FileWriteAction(
        task_id=OLD,
        source=AGENT,
        cause="old-step-1",
        path="squares.py",
        content="print([i * i for i in range(1, 11)])\n",
        thought="I will write it.",
        tool_call_id="call_write",
        llm_usage=USAGE,
        timestamp=LONG_AGO,
    )
    run = CmdRunAction(
        task_id=OLD,
        source=AGENT,
        cause="old-step-3",
        command="python3 squares.py",
        tool_call_id="call_run",
        llm_usage=USAGE,
        timestamp=LONG_AGO,
    )
    finish = AgentFinishAction(
        task_id=OLD,
        source=AGENT,
        cause="old-step-5",
        final_message="Done.",
        outputs={"file": "squares.py"},
        tool_call_id="call_finish",
        llm_usage=USAGE,
    )
    events = [
        MessageAction(task_id=OLD, source=USER, content="Print the squares"),
        AgentStateChangedObservation(task_id=OLD, source=ENV, agent_state=AgentState.RUNNING),
        write,
        SecurityVerdictObservation(
            task_id=OLD, source=ENV, cause=write.id, verdict=Verdict.ALLOW, risk=RiskLevel.LOW
        ),
        FileWriteObservation(task_id=OLD, source=ENV, cause=write.id, path="squares.py"),
        # A bad reply, a rate-limit notice and a condensation: none is an action to replay.
        ErrorObservation(
            task_id=OLD,
            source=AGENT,
            cause="old-step-2",
            error_code="bad_llm_reply",
            content="not JSON",
            llm_usage=USAGE,
        ),
        ChangeAgentStateAction(
            task_id=OLD, source=SYSTEM, cause="old-step-3", agent_state=AgentState.RATE_LIMITED
        ),
        CondensationAction(task_id=OLD, source=AGENT, cause="old-step-4", forgotten_up_to_seq=2),
        run,
        CmdOutputObservation(
            task_id=OLD,
            source=ENV,
            cause=run.id,
            command=run.command,
            content="[1, 4]\n",
            exit_code=0,
            cwd="/workspace",
        ),
        MessageAction(task_id=OLD, source=USER, content="Looks good, finish."),
        finish,
        AgentStateChangedObservation(task_id=OLD, source=ENV, agent_state=AgentState.FINISHED),
    ]
    return [
        json.loads(e.model_copy(update={"seq": i}).model_dump_json())
        for i, e in enumerate(events, 1)
    ]


def _step(n: int) -> StepRequest:
    return StepRequest(task_id=NEW, after_seq=0, iteration=n)


def test_only_the_agent_actions_are_replayed_in_order() -> None:
    actions = recorded_actions(_recording())
    assert [a.kind for a in actions] == ["write", "run", "finish"]


def test_entries_that_are_not_events_are_left_out() -> None:
    recording = _recording()
    broken = [recording[0], {"kind": "teleport", "task_id": OLD}, {"nonsense": 1}, *recording[1:]]
    assert [a.kind for a in recorded_actions(broken)] == ["write", "run", "finish"]


def test_the_next_action_is_counted_from_the_history() -> None:
    recording = _recording()
    history: list[Any] = [
        MessageAction(task_id=NEW, source=USER, content="Print the squares"),
        AgentStateChangedObservation(task_id=NEW, source=ENV, agent_state=AgentState.RUNNING),
    ]
    assert replay_index(history) == 0
    first = replayed_action(_step(1), recording, history)
    assert isinstance(first, FileWriteAction)

    history += [
        first,
        FileWriteObservation(task_id=NEW, source=ENV, cause=first.id, path="squares.py"),
        # What the controller and the reasoner add meanwhile does not move the index.
        CondensationAction(task_id=NEW, source=AGENT, forgotten_up_to_seq=1),
        ChangeAgentStateAction(task_id=NEW, source=SYSTEM, agent_state=AgentState.RATE_LIMITED),
        ErrorObservation(task_id=NEW, source=ENV, content="denied", error_code="security_denied"),
        MessageAction(task_id=NEW, source=USER, content="go on"),
    ]
    assert replay_index(history) == 1
    second = replayed_action(_step(2), recording, history)
    assert isinstance(second, CmdRunAction) and second.command == "python3 squares.py"

    history.append(second)
    third = replayed_action(_step(3), recording, history)
    assert isinstance(third, AgentFinishAction) and third.outputs == {"file": "squares.py"}

    # Used up: the LLM takes over.
    history.append(AgentThinkAction(task_id=NEW, source=AGENT, thought="more"))
    assert replayed_action(_step(4), recording, [*history, third]) is None


def test_a_replayed_action_keeps_what_was_recorded_and_answers_this_step() -> None:
    step = _step(1)
    action = replayed_action(step, _recording(), [])
    assert isinstance(action, FileWriteAction)
    assert (action.path, action.thought, action.tool_call_id) == (
        "squares.py",
        "I will write it.",
        "call_write",
    )
    assert action.content == "print([i * i for i in range(1, 11)])\n"
    assert action.source is AGENT
    assert action.id == step_event_id(step) and action.cause == step.id
    assert action.task_id == NEW and action.seq is None
    assert action.llm_usage is None  # nothing was spent
    assert action.timestamp > LONG_AGO


def test_the_same_step_gets_the_same_answer() -> None:
    step = _step(1)
    a = replayed_action(step, _recording(), [])
    b = replayed_action(step, _recording(), [])
    assert a is not None and b is not None
    assert a.model_dump(exclude={"timestamp"}) == b.model_dump(exclude={"timestamp"})


def test_an_empty_trajectory_replays_nothing() -> None:
    assert replayed_action(_step(1), [], []) is None
