"""The condenser on real NATS with litellm calling the scripted server: a history that outgrows
the prompt budget gets a CondensationAction instead of an LLM call, and the next step's prompt,
condensed, still lets the model carry on where it was."""

from __future__ import annotations

from condensing import READ_EVERY_PART, record_output
from reasoner_doubles import Harness

from services.reasoner.prompt import CONDENSED_PREFIX
from services.reasoner.replies import step_event_id
from shared.events import CmdRunAction, CondensationAction, EventSource

TASK = "long history: read every part"
SCRIPT_CONVERSATIONS = [{"match": "long history", "turns": READ_EVERY_PART}]
# Each output is about 1,000 tokens and the head (system prompt, task, tools) about 630: the
# fourth step's prompt (three outputs) is over budget, and condensing it to 60% of the budget
# forgets the first two steps.
# (The head's size is that of the tools before the V1 ones of issue 29: they are withheld.)
REASONER_SETTINGS = {
    "llm_max_input_tokens": 3000,
    "condenser_keep_recent": 1,
    "agent_withheld_tools": ["glob", "grep", "apply_patch", "task_tracker"],
}


async def test_a_long_history_is_condensed_and_the_task_goes_on(harness: Harness) -> None:
    h = harness
    task_id = h.new_task(TASK)
    for k in (1, 2, 3):
        await h.step(task_id, k)
        run = await h.answer(task_id)
        assert isinstance(run, CmdRunAction) and run.command == f"cat part{k}.txt"
        h.storage.append(run, record_output(run, k))
    # Seqs: 1 task, 2 RUNNING, then each step's action and output: 3-4, 5-6, 7-8.
    assert await h.llm_requests(TASK) == 3

    step = await h.step(task_id, 4)
    condensation = await h.answer(task_id)
    assert isinstance(condensation, CondensationAction)
    assert condensation.id == step_event_id(step) and condensation.cause == step.id
    assert condensation.source is EventSource.AGENT and condensation.llm_usage is None
    assert condensation.forgotten_up_to_seq == 6  # steps 1 and 2, with their outputs
    lines = condensation.summary.splitlines()
    assert lines[0].startswith('- ran `cat part1.txt` -> exit 0, 2220 chars of output ending "')
    assert lines[1].startswith("- ran `cat part2.txt` -> exit 0")
    assert len(lines) == 2
    assert CONDENSED_PREFIX not in condensation.summary  # the prompt adds the note around it
    assert await h.llm_requests(TASK) == 3  # condensed instead of calling the LLM

    # The controller logs the condensation and asks again: the condensed prompt fits, and the
    # model (told that 2 earlier steps were condensed) reads the next part.
    h.storage.append(condensation)
    await h.step(task_id, 5)
    run = await h.answer(task_id)
    assert isinstance(run, CmdRunAction) and run.command == "cat part4.txt"
    assert await h.llm_requests(TASK) == 4
