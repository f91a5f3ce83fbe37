"""A reply with several tool calls (issue 29): the first runs, the rest ride on it as its plan
and run in turn without an LLM call while each succeeds; a failure, a user's message or a
planned finish ends the plan and the model is asked again."""

from __future__ import annotations

from typing import Any

from services.reasoner.prompt import build_messages
from services.reasoner.replies import LLMReply, planned_event, reply_event, step_event_id
from shared.commands import StepRequest
from shared.events import (
    CmdOutputObservation,
    CmdRunAction,
    EventSource,
    FileReadAction,
    FileWriteAction,
    FileWriteObservation,
    LLMUsage,
    MessageAction,
    PlannedCall,
)

USAGE = LLMUsage(model="openai/scripted", prompt_tokens=10, completion_tokens=5)
TASK = MessageAction(
    task_id="t1", source=EventSource.USER, seq=1, content="Write emails.txt's distinct lines."
)
# What the 1.5B model answered (its first call alone created an empty file, and it finished).
REPLY = """```json
{"tool": "write_file", "arguments": {"path": "unique.txt", "content": ""}}
```

```json
{"tool": "execute_bash", "arguments": {"command": "sort emails.txt | uniq > unique.txt"}}
```

```json
{"tool": "read_file", "arguments": {"path": "unique.txt"}}
```

```json
{"message": "The distinct lines, sorted, are written to unique.txt"}
```"""


def _step(n: int) -> StepRequest:
    return StepRequest(task_id="t1", after_seq=n, iteration=n)


def _written(action: Any, seq: int) -> list[Any]:
    done = FileWriteObservation(
        task_id="t1",
        source=EventSource.ENVIRONMENT,
        cause=action.id,
        path="/workspace/unique.txt",
        content="Wrote 0 bytes to /workspace/unique.txt",
        seq=seq + 1,
    )
    return [action.model_copy(update={"seq": seq}), done]


def _ran(action: Any, seq: int, exit_code: int) -> list[Any]:
    out = CmdOutputObservation(
        task_id="t1",
        source=EventSource.ENVIRONMENT,
        cause=action.id,
        command=action.command,
        content="",
        exit_code=exit_code,
        cwd="/workspace",
        seq=seq + 1,
    )
    return [action.model_copy(update={"seq": seq}), out]


def test_the_calls_after_the_first_are_its_plan_up_to_a_finish() -> None:
    first = reply_event(
        _step(1), LLMReply(content=REPLY, usage=USAGE), native=False, planned_limit=4
    )
    assert isinstance(first, FileWriteAction) and first.content == ""
    assert [c.tool for c in first.planned] == ["execute_bash", "read_file"]  # no finish
    assert first.planned[0] == PlannedCall(
        tool="execute_bash", arguments='{"command": "sort emails.txt | uniq > unique.txt"}'
    )
    one = reply_event(_step(1), LLMReply(content=REPLY, usage=USAGE), native=False, planned_limit=1)
    assert [c.tool for c in one.planned] == ["execute_bash"]  # type: ignore[union-attr]
    off = reply_event(_step(1), LLMReply(content=REPLY, usage=USAGE), native=False, planned_limit=0)
    assert off.planned == ()  # type: ignore[union-attr]


def test_each_planned_call_runs_next_while_the_one_before_succeeded() -> None:
    first = reply_event(
        _step(1), LLMReply(content=REPLY, usage=USAGE), native=False, planned_limit=4
    )
    events = [TASK, *_written(first, 2)]
    step = _step(3)
    second = planned_event(step, events)
    assert isinstance(second, CmdRunAction) and second.command.startswith("sort emails.txt")
    assert second.id == step_event_id(step) and second.llm_usage is None  # no LLM call
    assert [c.tool for c in second.planned] == ["read_file"]
    again = planned_event(step, events)  # a redelivered step: the same action
    assert again is not None and (again.id, again.command) == (second.id, second.command)  # type: ignore[attr-defined]

    ran = [*events, *_ran(second, 4, exit_code=0)]
    third = planned_event(_step(5), ran)
    assert isinstance(third, FileReadAction) and third.path == "unique.txt"
    assert third.planned == ()
    # The prompt shows each as a call of the model's own, with its result.
    messages = build_messages(ran, native=False)
    assert "sort emails.txt | uniq > unique.txt" in messages[4]["content"]


def test_a_failure_or_a_users_message_ends_the_plan() -> None:
    first = reply_event(
        _step(1), LLMReply(content=REPLY, usage=USAGE), native=False, planned_limit=4
    )
    events = [TASK, *_written(first, 2)]
    second = planned_event(_step(3), events)
    assert second is not None
    assert planned_event(_step(5), [*events, *_ran(second, 4, exit_code=1)]) is None
    said = MessageAction(task_id="t1", source=EventSource.USER, seq=4, content="stop that")
    assert planned_event(_step(5), [*events, said]) is None
    # The model was asked since (an invalid reply of its own): its plan is over.
    assert planned_event(_step(1), [TASK]) is None
