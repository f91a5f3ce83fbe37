"""The reasoner on real NATS, calling the scripted LLM server through litellm over HTTP."""

from __future__ import annotations

import asyncio
import json
import uuid

from prometheus_client import REGISTRY
from reasoner_doubles import Harness

from services.reasoner.replies import step_event_id
from shared.commands import StepRequest
from shared.events import (
    AgentFinishAction,
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    EventSource,
    FileWriteAction,
    FileWriteObservation,
    MessageAction,
    RiskLevel,
    RunPythonAction,
    SecurityVerdictObservation,
    Verdict,
)
from shared.subjects import Service, dlq_subject, work_subject

SQUARES = "".join(f"{i} squared is {i * i}\n" for i in range(1, 11))


def _step(task_id: str, after_seq: int) -> StepRequest:
    return StepRequest(task_id=task_id, after_seq=after_seq, iteration=1)


def _tokens(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"model": "openai/scripted"}) or 0.0


async def test_the_seed_task_step_by_step(harness: Harness) -> None:
    h = harness
    prompt_tokens_before = _tokens("deckhands_llm_prompt_tokens_total")
    task_id = h.new_task("Write a Python script that prints the squares of 1 to 10 and run it")

    step = await h.step(task_id, 1)
    write = await h.answer(task_id)
    assert isinstance(write, FileWriteAction)
    assert write.path == "squares.py"
    assert write.content == 'for i in range(1, 11):\n    print(f"{i} squared is {i*i}")\n'
    assert write.id == step_event_id(step) and write.cause == step.id
    assert write.source is EventSource.AGENT and write.tool_call_id
    assert write.thought == "I will write the script first."
    assert write.llm_usage is not None and write.llm_usage.model == "openai/scripted"
    assert write.llm_usage.prompt_tokens > 0 and write.llm_usage.completion_tokens > 0
    assert write.llm_usage.latency_ms > 0

    # What the controller, security and runtime would log in between.
    h.storage.append(
        write,
        SecurityVerdictObservation(
            task_id=task_id,
            source=EventSource.ENVIRONMENT,
            cause=write.id,
            verdict=Verdict.ALLOW,
            risk=RiskLevel.LOW,
        ),
        FileWriteObservation(
            task_id=task_id, source=EventSource.ENVIRONMENT, cause=write.id, path="squares.py"
        ),
    )
    await h.step(task_id, 2)
    run = await h.answer(task_id)
    assert isinstance(run, CmdRunAction) and run.command == "python3 squares.py"

    h.storage.append(
        run,
        CmdOutputObservation(
            task_id=task_id,
            source=EventSource.ENVIRONMENT,
            cause=run.id,
            command=run.command,
            content=SQUARES,
            exit_code=0,
            cwd="/workspace",
        ),
    )
    await h.step(task_id, 3)
    finish = await h.answer(task_id)
    assert isinstance(finish, AgentFinishAction)
    assert "10 squared is 100" in finish.final_message
    assert finish.outputs == {"file": "squares.py"}
    assert _tokens("deckhands_llm_prompt_tokens_total") > prompt_tokens_before


async def test_a_malformed_tool_call_is_an_error_the_model_recovers_from(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("a malformed call, please")
    step = await h.step(task_id)
    error = await h.answer(task_id)
    assert isinstance(error, ErrorObservation)
    assert error.error_code == "bad_llm_reply" and "not valid JSON" in error.content
    assert error.cause == step.id and error.id == step_event_id(step)

    # The controller logs the error and asks again: the model sees it and moves on.
    h.storage.append(error)
    await h.step(task_id, 2)
    finish = await h.answer(task_id)
    assert isinstance(finish, AgentFinishAction)
    assert "Your previous reply was invalid" in finish.final_message


async def test_an_unknown_tool_is_an_error(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("use an unknown tool")
    await h.step(task_id)
    error = await h.answer(task_id)
    assert isinstance(error, ErrorObservation) and "browse_web" in error.content


async def test_plain_text_is_a_question_for_the_user(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("ask me a question")
    await h.step(task_id)
    question = await h.answer(task_id)
    assert isinstance(question, MessageAction)
    assert question.wait_for_response and question.content == "Which directory should I use?"


async def test_a_call_written_as_text_is_understood(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("json in text")
    await h.step(task_id)
    action = await h.answer(task_id)
    assert isinstance(action, RunPythonAction) and action.code == "print(6 * 7)"


async def test_a_step_waits_for_storage_to_catch_up(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("Write a Python script that prints the squares")
    # The controller appended seq 3 already; storage has not written it yet.
    await h.step(task_id, request=_step(task_id, after_seq=3))

    async def storage_catches_up() -> None:
        await asyncio.sleep(0.5)
        h.storage.append(MessageAction(task_id=task_id, source=EventSource.USER, content="go"))

    catch_up = asyncio.create_task(storage_catches_up())
    action = await h.answer(task_id)
    await catch_up
    assert isinstance(action, FileWriteAction)


async def test_a_failing_llm_call_is_redelivered_and_then_answers(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("a flaky model")
    await h.step(task_id)
    action = await h.answer(task_id)
    assert isinstance(action, CmdRunAction) and action.command == "ls"


async def test_an_llm_down_on_every_delivery_gives_an_llm_error(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("the model is down for good")
    step = await h.step(task_id)
    error = await h.answer(task_id)
    assert isinstance(error, ErrorObservation)
    assert error.error_code == "llm_error" and error.cause == step.id
    assert "500" in error.content or "InternalServerError" in error.content


async def test_a_step_handled_twice_gives_one_answer(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("Write a Python script that prints the squares")
    step = _step(task_id, after_seq=2)
    # The same step delivered twice (e.g. the controller's outbox replayed with a new msg id).
    await h.step(task_id, request=step, msg_id="first")
    await h.step(task_id, request=step, msg_id="second")
    first = await h.answer(task_id)
    assert first.id == step_event_id(step)
    assert await h.nothing_within(task_id, 2.0)


async def test_a_runnable_answer_goes_where_the_step_request_says(harness: Harness) -> None:
    """The controller's policy chooses each hop: by default a runnable action goes to the
    security monitor (a ReviewAction); a step request saying otherwise sends it straight to
    the controller."""
    h = harness
    for review, subject in ((True, Service.SECURITY), (False, Service.CONTROLLER)):
        task_id = h.new_task("Write a Python script that prints the squares of 1 to 10 and run it")
        step = StepRequest(task_id=task_id, after_seq=2, iteration=1, review_runnable=review)
        await h.step(task_id, request=step)
        msgs = await (await h._sub(task_id)).fetch(1, timeout=30)
        await msgs[0].ack()
        assert msgs[0].subject == work_subject(subject, task_id), (review, msgs[0].subject)
        assert h.storage.last_seq(task_id) == 2


async def test_a_step_for_an_unknown_task_is_dead_lettered_on_its_first_delivery(
    harness: Harness,
) -> None:
    h = harness
    dead = await h.nc.subscribe(dlq_subject(Service.REASONER))
    task_id = uuid.uuid4().hex  # no State, no history: not a task anyone created
    step = await h.step(task_id, request=_step(task_id, after_seq=3))
    letter = await dead.next_msg(timeout=20)
    await dead.unsubscribe()
    assert json.loads(letter.data)["id"] == step.id
    headers = letter.headers or {}
    assert "is unknown" in headers["Deckhands-Dlq-Reason"]
    assert headers["Deckhands-Dlq-Deliveries"] == "1"


async def test_a_step_that_carries_its_new_entries_reads_no_history(harness: Harness) -> None:
    """The controller sends the entries logged since the previous step with the next one: a
    reasoner that has the log up to there (or a new task's whole log) asks storage nothing."""
    h = harness
    task_id = h.new_task("Write a Python script that prints the squares of 1 to 10 and run it")
    first = list(h.storage.logs[task_id])  # the message and RUNNING, as the controller logged
    before = h.storage.requests
    await h.step(
        task_id,
        request=StepRequest(
            task_id=task_id,
            after_seq=2,
            iteration=1,
            events=first,
        ),
    )
    write = await h.answer(task_id)
    assert isinstance(write, FileWriteAction)
    new = h.storage.append(
        write,
        FileWriteObservation(
            task_id=task_id, source=EventSource.ENVIRONMENT, cause=write.id, path="squares.py"
        ),
    )
    await h.step(
        task_id,
        request=StepRequest(
            task_id=task_id,
            after_seq=4,
            iteration=2,
            events=[e.model_dump(mode="json") for e in new],
        ),
    )
    run = await h.answer(task_id)
    assert isinstance(run, CmdRunAction) and run.command == "python3 squares.py"
    assert h.storage.requests == before  # both steps read nothing from storage
