"""The scripted server's rate limits, context window, request counts and condensed history."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.scripted_llm import ScriptedLLMServer, ScriptError
from tools.scripted_llm.responder import PROMPT_TASKS, PROMPTS_PER_TASK
from tools.scripted_llm.script import parse_script

ROOT = Path(__file__).resolve().parents[3]
_NO_LIMITS_SEEN = {
    "refused_429": 0,
    "max_concurrent_seen": 0,
    "max_requests_in_60s": 0,
    "max_tokens_in_60s": 0,
}


def _chat(server: ScriptedLLMServer | str, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": "scripted", "messages": messages}
    base_url = server if isinstance(server, str) else server.base_url
    return httpx.post(f"{base_url}/chat/completions", json=body, timeout=10)


def _stats(server: ScriptedLLMServer) -> dict[str, Any]:
    return dict(httpx.get(f"{server.base_url}/stats", timeout=5).json())


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
        assert httpx.get(stats_url, timeout=5).json() == {
            "requests": 0,
            "tasks": {},
            **_NO_LIMITS_SEEN,
        }
        for text in ("one", "one", "two"):
            _chat(server, _user(text))
        stats = _stats(server)
        assert stats.pop("max_tokens_in_60s") > 0
        assert stats == {  # failures count too
            "requests": 3,
            "tasks": {"one": 2, "two": 1},
            "refused_429": 0,
            "max_concurrent_seen": 1,
            "max_requests_in_60s": 3,
        }


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
        ({"turns": [{"content": "x"}], "limits": {"max_concurrent": 0}}, "max_concurrent"),
        ({"turns": [{"content": "x"}], "limits": {"tokens_per_minute": "9"}}, "tokens_per"),
        ({"turns": [{"content": "x"}], "limits": {"retry_after_s": -1}}, "retry_after_s"),
        ({"turns": [{"content": "x"}], "limits": {"rpm": 5}}, "unknown keys"),
    ],
)
def test_bad_limits_are_refused(raw: Any, problem: str) -> None:
    with pytest.raises(ScriptError, match=problem):
        parse_script(raw)


# --- a provider's limits ---------------------------------------------------------------------


def _in_parallel(server: ScriptedLLMServer, count: int) -> list[httpx.Response]:
    start = threading.Barrier(count)
    answers: list[httpx.Response] = []

    def call(i: int) -> None:
        start.wait()
        answers.append(_chat(server, _user(f"parallel {i}")))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return answers


def test_requests_beyond_max_concurrent_are_refused_at_once() -> None:
    script = parse_script(
        {"turns": [{"content": "ok", "delay_s": 0.5}], "limits": {"max_concurrent": 2}}
    )
    with ScriptedLLMServer(script) as server:
        answers = _in_parallel(server, 5)
        assert sorted(a.status_code for a in answers) == [200, 200, 429, 429, 429]
        for refused in (a for a in answers if a.status_code == 429):
            assert refused.headers["Retry-After"] == "1"
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert refused.elapsed.total_seconds() < 0.4  # not held for the delay
        stats = _stats(server)
        assert stats["max_concurrent_seen"] == 2 and stats["refused_429"] == 3
        assert stats["requests"] == 2 and stats["max_requests_in_60s"] == 2  # refused: not
        assert _chat(server, _user("after")).status_code == 200  # room again


def test_requests_per_minute_is_a_sliding_window() -> None:
    script = parse_script({"turns": [{"content": "ok"}], "limits": {"requests_per_minute": 3}})
    with ScriptedLLMServer(script) as server:
        assert [_chat(server, _user("t")).status_code for _ in range(3)] == [200] * 3
        refused = _chat(server, _user("t"))
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60  # whole seconds
        stats = _stats(server)
        assert stats["requests"] == 3 and stats["tasks"] == {"t": 3}
        assert stats["refused_429"] == 1 and stats["max_requests_in_60s"] == 3


def test_tokens_per_minute_counts_prompt_and_completion_tokens() -> None:
    script = parse_script({"turns": [{"content": "ok"}], "limits": {"tokens_per_minute": 100}})
    with ScriptedLLMServer(script) as server:
        big = _chat(server, _user("x" * 200))
        assert big.status_code == 200
        used = big.json()["usage"]["total_tokens"]
        assert 50 < used < 100
        refused = _chat(server, _user("y" * 200))  # the window's tokens + its prompt: over
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        small = _chat(server, _user("z"))  # still fits
        assert small.status_code == 200
        too_large = _chat(server, _user("w" * 500))  # never fits
        assert too_large.status_code == 429 and too_large.headers["Retry-After"] == "60"
        stats = _stats(server)
        assert stats["refused_429"] == 2 and stats["requests"] == 2
        assert stats["max_tokens_in_60s"] == used + small.json()["usage"]["total_tokens"]


def test_the_command_line_limits_win_over_the_script(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps({"turns": [{"content": "ok"}], "limits": {"requests_per_minute": 5}})
    )
    command = [sys.executable, "-m", "tools.scripted_llm", "--script", str(script), "--port", "0"]
    with subprocess.Popen(
        [*command, "--requests-per-minute", "1"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert "requests_per_minute 1" in line
            base_url = line.split(" on ", 1)[1].split()[0]
            assert _chat(base_url, _user("t")).status_code == 200
            assert _chat(base_url, _user("t")).status_code == 429
        finally:
            process.terminate()
            process.wait(5)


def _wait_until_admitted(server: ScriptedLLMServer) -> None:
    """Until a request is being answered (its delay_s still to run)."""
    deadline = time.monotonic() + 5
    while _stats(server)["max_concurrent_seen"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)


async def test_litellm_raises_a_rate_limit_error_with_the_retry_after() -> None:
    from services.reasoner.llm import retry_after_s

    litellm = importlib.import_module("litellm")  # after llm: it sets the offline cost map

    script = parse_script(
        {
            # The held call lasts long enough for litellm's first call (slow: it sets itself
            # up) to arrive while it runs.
            "conversations": [{"match": "held", "turns": [{"content": "ok", "delay_s": 3.0}]}],
            "turns": [{"content": "ok"}],
            "limits": {"max_concurrent": 1, "requests_per_minute": 2, "retry_after_s": 2.5},
        }
    )

    async def call() -> Any:
        return await litellm.acompletion(
            model="openai/scripted",
            api_base=server.base_url,
            api_key="x",
            messages=_user("t"),
            num_retries=0,
            max_retries=0,
        )

    with ScriptedLLMServer(script) as server:
        held = threading.Thread(target=_chat, args=(server, _user("held")))
        held.start()
        _wait_until_admitted(server)
        with pytest.raises(litellm.RateLimitError) as too_many:
            await call()
        assert retry_after_s(too_many.value) == 2.5
        held.join(5)
        assert (await call()).choices[0].message.content == "ok"  # the 2nd request this minute
        with pytest.raises(litellm.RateLimitError) as per_minute:
            await call()
        waited = retry_after_s(per_minute.value)
        assert waited is not None and 1 <= waited <= 60 and waited == int(waited)
        assert _stats(server)["refused_429"] == 2
