"""The condenser when the provider refuses a prompt as too long (no budget set): litellm raises
ContextWindowExceededError on the scripted server's 400, and the step gets a CondensationAction."""

from __future__ import annotations

from condensing import READ_EVERY_PART, record_output
from reasoner_doubles import Harness

from services.reasoner.replies import step_event_id
from shared.events import CmdRunAction, CondensationAction, ErrorObservation

TASK = "tight window: read every part"
# The server counts characters / 4: about 700 tokens of head and tools, 600 per output, so the
# third step's prompt (two outputs) does not fit in 1,600.
SCRIPT_CONVERSATIONS = [
    {"match": "tight window", "context_window": 1600, "turns": READ_EVERY_PART},
    {"match": "hopeless", "context_window": 100, "turns": READ_EVERY_PART},
]
# The head's size above is that of the tools before the V1 ones (issue 29): they are withheld.
REASONER_SETTINGS = {
    "llm_max_input_tokens": 0,
    "condenser_keep_recent": 1,
    "agent_withheld_tools": ["glob", "grep", "apply_patch", "task_tracker"],
}


async def test_a_context_window_error_condenses_the_history(harness: Harness) -> None:
    h = harness
    task_id = h.new_task(TASK)
    for k in (1, 2):
        await h.step(task_id, k)
        run = await h.answer(task_id)
        assert isinstance(run, CmdRunAction) and run.command == f"cat part{k}.txt"
        h.storage.append(run, record_output(run, k))

    step = await h.step(task_id, 3)
    condensation = await h.answer(task_id)
    assert isinstance(condensation, CondensationAction)
    assert condensation.id == step_event_id(step) and condensation.cause == step.id
    assert condensation.forgotten_up_to_seq == 4  # step 1 and its output
    assert condensation.summary.startswith("- ran `cat part1.txt` -> exit 0")
    assert await h.llm_requests(TASK) == 3  # the refused call was not retried

    h.storage.append(condensation)
    await h.step(task_id, 4)
    run = await h.answer(task_id)
    assert isinstance(run, CmdRunAction) and run.command == "cat part3.txt"


async def test_a_prompt_that_cannot_shrink_is_an_llm_error(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("hopeless: the task alone is too long")
    step = await h.step(task_id)
    error = await h.answer(task_id)
    assert isinstance(error, ErrorObservation)
    assert error.error_code == "llm_error" and error.cause == step.id
    assert "context" in error.content and "cannot be condensed any further" in error.content
    assert await h.nothing_within(task_id, 0.5)  # answered at once, not redelivered
