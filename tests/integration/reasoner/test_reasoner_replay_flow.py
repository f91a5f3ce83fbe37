"""Replay on real NATS and Redis: a task whose trajectory is stored gets the recorded agent
actions back in order, and the scripted LLM server sees no request for it until the recording
runs out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from reasoner_doubles import Harness
from redis.asyncio import Redis

from services.reasoner.replies import step_event_id
from shared.events import (
    AgentFinishAction,
    AgentState,
    AgentStateChangedObservation,
    AgentThinkAction,
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
from shared.trajectory import TrajectoryError, load_trajectory, save_trajectory, trajectory_key

# The seed conversation answers any other task: if the LLM were asked, it would write squares.py.
TASK = "Write a Python script that prints the squares of 1 to 10 and run it"
USAGE = LLMUsage(model="openai/gpt-4o", prompt_tokens=1200, completion_tokens=60, cost_usd=0.02)
AGENT, ENV, USER = EventSource.AGENT, EventSource.ENVIRONMENT, EventSource.USER
CUBES = "for i in range(1, 11):\n    print(i ** 3)\n"


def _exported(events: list[Any]) -> list[dict[str, Any]]:
    """As GET /v1/tasks/{id}/trajectory exports them: each event as JSON, with its seq."""
    return [
        json.loads(e.model_copy(update={"seq": i}).model_dump_json())
        for i, e in enumerate(events, 1)
    ]


def _recorded_run() -> list[dict[str, Any]]:
    old = "an-earlier-task"
    write = FileWriteAction(
        task_id=old,
        source=AGENT,
        cause="s1",
        path="cubes.py",
        content=CUBES,
        thought="Cubes this time.",
        tool_call_id="call_rec_1",
        llm_usage=USAGE,
    )
    run = CmdRunAction(
        task_id=old,
        source=AGENT,
        cause="s2",
        command="python3 cubes.py",
        tool_call_id="call_rec_2",
        llm_usage=USAGE,
    )
    finish = AgentFinishAction(
        task_id=old,
        source=AGENT,
        cause="s3",
        final_message="Printed the cubes.",
        outputs={"file": "cubes.py"},
        tool_call_id="call_rec_3",
        llm_usage=USAGE,
    )
    return _exported(
        [
            MessageAction(task_id=old, source=USER, content=TASK),
            AgentStateChangedObservation(task_id=old, source=ENV, agent_state=AgentState.RUNNING),
            write,
            SecurityVerdictObservation(
                task_id=old, source=ENV, cause=write.id, verdict=Verdict.ALLOW, risk=RiskLevel.LOW
            ),
            FileWriteObservation(task_id=old, source=ENV, cause=write.id, path="cubes.py"),
            ErrorObservation(
                task_id=old, source=AGENT, cause="s2", error_code="bad_llm_reply", content="bad"
            ),
            CondensationAction(task_id=old, source=AGENT, cause="s2", forgotten_up_to_seq=2),
            run,
            CmdOutputObservation(
                task_id=old,
                source=ENV,
                cause=run.id,
                command=run.command,
                content="1\n8\n27\n",
                exit_code=0,
                cwd="/workspace",
            ),
            finish,
            AgentStateChangedObservation(task_id=old, source=ENV, agent_state=AgentState.FINISHED),
        ]
    )


async def test_a_stored_trajectory_is_replayed_without_the_llm(
    harness: Harness, redis: Redis
) -> None:
    h = harness
    task_id = h.new_task(TASK)
    await save_trajectory(redis, task_id, _recorded_run())

    step = await h.step(task_id, 1)
    write = await h.answer(task_id)
    assert isinstance(write, FileWriteAction)
    assert (write.path, write.content, write.thought) == ("cubes.py", CUBES, "Cubes this time.")
    assert write.tool_call_id == "call_rec_1"
    assert write.id == step_event_id(step) and write.cause == step.id
    assert write.task_id == task_id and write.source is AGENT and write.llm_usage is None

    h.storage.append(
        write, FileWriteObservation(task_id=task_id, source=ENV, cause=write.id, path="cubes.py")
    )
    await h.step(task_id, 2)
    run = await h.answer(task_id)
    assert isinstance(run, CmdRunAction) and run.command == "python3 cubes.py"

    h.storage.append(
        run,
        CmdOutputObservation(
            task_id=task_id,
            source=ENV,
            cause=run.id,
            command=run.command,
            content="1\n8\n",
            exit_code=0,
            cwd="/workspace",
        ),
    )
    await h.step(task_id, 3)
    finish = await h.answer(task_id)
    assert isinstance(finish, AgentFinishAction)
    assert finish.final_message == "Printed the cubes." and finish.outputs == {"file": "cubes.py"}
    assert await h.llm_requests(TASK) == 0


async def test_past_the_last_recorded_action_the_llm_takes_over(
    harness: Harness, redis: Redis
) -> None:
    h = harness
    task = f"{TASK} (a short recording)"
    task_id = h.new_task(task)
    think = AgentThinkAction(
        task_id="old", source=AGENT, thought="Plan: write, run.", tool_call_id="call_t"
    )
    await save_trajectory(redis, task_id, _exported([think]))

    await h.step(task_id, 1)
    replayed = await h.answer(task_id)
    assert isinstance(replayed, AgentThinkAction) and replayed.thought == "Plan: write, run."
    assert await h.llm_requests(task) == 0

    h.storage.append(replayed)
    await h.step(task_id, 2)
    action = await h.answer(task_id)
    assert action.llm_usage is not None and action.llm_usage.model == "openai/scripted"
    assert await h.llm_requests(task) == 1


async def test_a_corrupt_trajectory_leaves_the_task_to_the_llm(
    harness: Harness, redis: Redis
) -> None:
    h = harness
    task = f"{TASK} (corrupt recording)"
    task_id = h.new_task(task)
    await redis.set(trajectory_key(task_id), "{not json")
    await h.step(task_id, 1)
    action = await h.answer(task_id)
    assert isinstance(action, FileWriteAction) and action.path == "squares.py"
    assert await h.llm_requests(task) == 1


async def test_trajectories_round_trip_through_redis(redis: Redis) -> None:
    events = _recorded_run()
    await save_trajectory(redis, "t-round-trip", events, ttl_s=60)
    assert await load_trajectory(redis, "t-round-trip") == events
    assert 0 < await redis.ttl(trajectory_key("t-round-trip")) <= 60
    assert await load_trajectory(redis, "t-none") is None
    with pytest.raises(TrajectoryError):
        await save_trajectory(redis, "t-bad", [1, 2])  # type: ignore[list-item]
    await redis.set(trajectory_key("t-bad"), json.dumps({"events": []}))
    with pytest.raises(TrajectoryError):
        await load_trajectory(redis, "t-bad")
