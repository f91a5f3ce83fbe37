"""The reasoner with prompt-based tool calling: no `tools` in the request, the scripted server
writes each call as JSON text, and the reasoner reads it back out."""

from __future__ import annotations

from reasoner_doubles import Harness

from services.reasoner.replies import step_event_id
from shared.events import (
    AgentFinishAction,
    CmdOutputObservation,
    CmdRunAction,
    EventSource,
    FileWriteAction,
    FileWriteObservation,
)

# A tiny page size makes every history fetch page through storage's replies.
REASONER_SETTINGS = {"llm_native_tool_calling": "false", "history_page_size": 2}
SQUARES = "".join(f"{i} squared is {i * i}\n" for i in range(1, 11))


async def test_the_seed_task_without_native_tool_calls(harness: Harness) -> None:
    h = harness
    requests_before = h.storage.requests
    task_id = h.new_task("Write a Python script that prints the squares of 1 to 10 and run it")

    step = await h.step(task_id, 1)
    write = await h.answer(task_id)
    assert isinstance(write, FileWriteAction) and write.path == "squares.py"
    assert 'print(f"{i} squared is {i*i}")' in write.content
    # The id was made up by the reasoner: the call came as text, not as a native tool call.
    assert write.tool_call_id == f"call_{step_event_id(step)[:24]}"
    assert write.thought == "I will write the script first."

    h.storage.append(
        write,
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
    # Two events per page: the three steps saw 2, 4 and 6 events, but each read only the two
    # logged since the step before (one page each), not the whole history again.
    assert h.storage.requests - requests_before == 1 + 1 + 1
