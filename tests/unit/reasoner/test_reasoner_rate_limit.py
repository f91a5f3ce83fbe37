"""Rate limits: the Retry-After a provider asks for, and the RATE_LIMITED notices' identity."""

from __future__ import annotations

import time
from email.utils import formatdate
from types import SimpleNamespace

import httpx
import pytest

from services.reasoner.llm import retry_after_s
from services.reasoner.replies import rate_limited_event, rate_limited_event_id, step_event_id
from shared.commands import StepRequest
from shared.events import AgentState, EventSource


def _error(headers: dict[str, str]) -> Exception:
    exc = Exception("429")
    exc.response = httpx.Response(429, headers=headers)  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_read_from_the_response(
    headers: dict[str, str], expected: float | None
) -> None:
    assert retry_after_s(_error(headers)) == expected


def test_retry_after_as_an_http_date() -> None:
    wait = retry_after_s(_error({"Retry-After": formatdate(time.time() + 30, usegmt=True)}))
    assert wait is not None and 25 <= wait <= 31


def test_retry_after_from_litellm_s_copy_of_the_headers() -> None:
    exc = SimpleNamespace(litellm_response_headers={"retry-after": "4"}, response=None)
    assert retry_after_s(exc) == 4.0  # type: ignore[arg-type]


def test_each_attempt_has_its_own_notice_the_same_on_every_delivery() -> None:
    step = StepRequest(task_id="t", after_seq=3, iteration=2)
    first, second = rate_limited_event(step, 1, 2.0), rate_limited_event(step, 2, 4.5)
    assert first.id == rate_limited_event_id(step, 1) == rate_limited_event(step, 1, 9).id
    assert len({first.id, second.id, step_event_id(step)}) == 3
    assert first.source is EventSource.SYSTEM and first.cause == step.id
    assert first.agent_state is AgentState.RATE_LIMITED and first.task_id == "t"
    assert first.reason == "LLM rate limit: retrying in 2s"
    assert second.reason == "LLM rate limit: retrying in 4.5s"
