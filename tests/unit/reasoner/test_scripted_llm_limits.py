"""The scripted server's rate limits, context window, request counts and condensed history."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tools.scripted_llm import ScriptedLLMServer, ScriptError
from tools.scripted_llm.server import PROMPT_TASKS, PROMPTS_PER_TASK, parse_script


def _chat(server: ScriptedLLMServer, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": "scripted", "messages": messages}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=10)


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "sys"}, {"role": "user", "content": text}]


def test_a_rate_limit_says_when_to_retry() -> None:
    script = parse_script(
        [{"content": "ok", "fail_first": {"status": 429, "times": 1, "retry_after": 2.5}}]
    )
    with ScriptedLLMServer(script) as server:
        limited = _chat(server, _user("t"))
        assert limited.status_code == 429 and limited.headers["Retry-After"] == "2.5"
        assert limited.json()["error"]["type"] == "rate_limit_error"
        again = _chat(server, _user("t"))
        assert again.status_code == 200 and "Retry-After" not in again.headers


def test_a_prompt_over_the_context_window_is_refused() -> None:
    script = parse_script(
        {"conversations": [{"match": "small", "context_window": 50, "turns": [{"content": "ok"}]}]}
    )
    with ScriptedLLMServer(script) as server:
        assert _chat(server, _user("small prompt")).status_code == 200
        refused = _chat(server, _user("small prompt " + "x" * 400))
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert error["message"].startswith("This model's maximum context length is 50 tokens")


def test_requests_are_counted_per_task() -> None:
    script = parse_script([{"content": "ok", "fail_first": {"status": 503, "times": 1}}])
    with ScriptedLLMServer(script) as server:
        stats_url = server.base_url.removesuffix("/v1") + "/stats"
        assert httpx.get(stats_url, timeout=5).json() == {"requests": 0, "tasks": {}}
        for text in ("one", "one", "two"):
            _chat(server, _user(text))
        stats = httpx.get(f"{server.base_url}/stats", timeout=5).json()
        assert stats == {"requests": 3, "tasks": {"one": 2, "two": 1}}  # failures count too


def test_the_last_prompts_of_each_task_are_reported() -> None:
    script = parse_script([{"content": "ok"}])
    with ScriptedLLMServer(script) as server:
        prompts_url = server.base_url.removesuffix("/v1") + "/prompts"
        assert httpx.get(prompts_url, params={"task": "one"}, timeout=5).json() == {"prompts": []}
        for i in range(PROMPTS_PER_TASK + 2):
            _chat(server, [{"role": "system", "content": f"sys {i}"}, *_user("task one")[1:]])
        _chat(server, _user("task two"))
        found = httpx.get(prompts_url, params={"task": "one"}, timeout=5).json()["prompts"]
        assert [p["task"] for p in found] == ["task one"]
        systems = [r["messages"][0]["content"] for r in found[0]["requests"]]
        assert systems == [f"sys {i}" for i in range(2, PROMPTS_PER_TASK + 2)]  # the last ones
        for i in range(PROMPT_TASKS + 1):
            _chat(server, _user(f"other {i}"))
        kept = httpx.get(prompts_url, timeout=5).json()["prompts"]
        assert len(kept) == PROMPT_TASKS and "task one" not in [p["task"] for p in kept]


def test_condensed_history_counts_as_the_replies_it_stands_for() -> None:
    script = parse_script([{"content": "reply {{turn}}"}])
    with ScriptedLLMServer(script) as server:
        messages = [
            *_user("t"),
            {"role": "user", "content": "[Condensed history] 5 earlier steps were condensed."},
            {"role": "assistant", "content": "reply 6"},
            {"role": "user", "content": "and?"},
        ]
        answer = _chat(server, messages).json()["choices"][0]["message"]["content"]
        assert answer == "reply 7"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ([{"content": "x", "fail_first": {"status": 429, "retry_after": -1}}], "retry_after"),
        ([{"content": "x", "fail_first": {"status": 429, "wait": 1}}], "fail_first"),
        (
            {"conversations": [{"match": "a", "turns": [{"content": "x"}], "context_window": 0}]},
            "context_window",
        ),
        (
            {"conversations": [{"match": "a", "turns": [{"content": "x"}], "window": 9}]},
            "unknown keys",
        ),
    ],
)
def test_bad_limits_are_refused(raw: Any, problem: str) -> None:
    with pytest.raises(ScriptError, match=problem):
        parse_script(raw)
