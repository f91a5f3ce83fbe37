"""Rate limits on real NATS: while the reasoner waits one out, the controller gets a RATE_LIMITED
notice per attempt (the scripted server answers 429 with a Retry-After), then the answer."""

from __future__ import annotations

import time

from reasoner_doubles import Harness

from services.reasoner.replies import rate_limited_event_id, step_event_id
from shared.events import (
    AgentState,
    ChangeAgentStateAction,
    CmdRunAction,
    ErrorObservation,
    EventSource,
)

SCRIPT_CONVERSATIONS = [
    {
        "match": "rate limited twice",
        "turns": [
            {
                "tool": "execute_bash",
                "arguments": {"command": "ls"},
                "fail_first": {"status": 429, "times": 2, "retry_after": 0.5},
            },
        ],
    },
    {
        "match": "rate limited without a hint",
        "turns": [
            {"content": "Which file?", "fail_first": {"status": 429, "times": 1}},
        ],
    },
    {
        "match": "rate limited for good",
        "turns": [
            {"content": "never", "fail_first": {"status": 429, "times": 1000, "retry_after": 0.5}},
        ],
    },
]
# Fast backoff; one delivery waits out at most 1s of rate limits before giving the step back.
REASONER_SETTINGS = {"llm_retry_backoff_s": 0.3, "llm_rate_limit_max_wait_s": 1.0}


async def test_a_rate_limited_step_shows_rate_limited_then_answers(harness: Harness) -> None:
    h = harness
    task = "rate limited twice, list the files"
    task_id = h.new_task(task)
    started = time.monotonic()
    step = await h.step(task_id)

    notices = [await h.answer(task_id), await h.answer(task_id)]
    for attempt, notice in enumerate(notices, 1):
        assert isinstance(notice, ChangeAgentStateAction)
        assert notice.id == rate_limited_event_id(step, attempt)
        assert notice.source is EventSource.SYSTEM and notice.cause == step.id
        assert notice.agent_state is AgentState.RATE_LIMITED
        # The server's Retry-After.
        assert notice.reason == "LLM rate limit (openai/scripted): retrying in 0.5s"

    action = await h.answer(task_id)
    assert isinstance(action, CmdRunAction) and action.command == "ls"
    assert action.id == step_event_id(step) and action.cause == step.id
    assert time.monotonic() - started >= 1.0  # both waits were honoured
    assert await h.llm_requests(task) == 3
    assert await h.nothing_within(task_id, 0.5)


async def test_without_retry_after_the_reasoner_backs_off_on_its_own(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("rate limited without a hint")
    step = await h.step(task_id)
    notice = await h.answer(task_id)
    assert isinstance(notice, ChangeAgentStateAction)
    assert notice.id == rate_limited_event_id(step, 1)
    assert notice.reason == "LLM rate limit (openai/scripted): retrying in 0.3s"
    question = await h.answer(task_id)
    assert question.id == step_event_id(step) and question.kind == "message"


async def test_a_rate_limit_that_never_lifts_ends_in_an_llm_error(harness: Harness) -> None:
    h = harness
    task_id = h.new_task("rate limited for good")
    step = await h.step(task_id)
    # Each delivery waits 0.5s twice, then gives up; a redelivery sends the same notices again,
    # which JetStream drops as duplicates (same Nats-Msg-Id).
    first, second = await h.answer(task_id), await h.answer(task_id)
    assert [first.id, second.id] == [rate_limited_event_id(step, n) for n in (1, 2)]
    error = await h.answer(task_id)
    assert isinstance(error, ErrorObservation)
    assert error.error_code == "llm_error" and error.cause == step.id
    assert "still rate limited" in error.content
    assert await h.nothing_within(task_id, 0.5)
