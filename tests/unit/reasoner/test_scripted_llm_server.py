"""The scripted OpenAI-compatible server, over real HTTP on a free port."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.scripted_llm import ScriptedLLMServer, ScriptError, load_script
from tools.scripted_llm.script import parse_script

SCRIPTS = Path(__file__).resolve().parents[3] / "tools" / "scripted_llm" / "scripts"
TOOLS = [{"type": "function", "function": {"name": "execute_bash", "parameters": {}}}]


@pytest.fixture
def seed_server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer(load_script(SCRIPTS / "seed_squares.json")) as server:
        yield server


def _chat(
    server: ScriptedLLMServer, messages: list[dict[str, Any]], **extra: Any
) -> httpx.Response:
    body = {"model": "scripted", "messages": messages, **extra}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=10)


def _conversation(*replies: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Write squares"},
    ]
    for i, output in enumerate(replies):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "execute_bash", "arguments": "{}"},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": output})
    return messages


def test_every_shipped_script_loads() -> None:
    for path in SCRIPTS.glob("*.json"):
        assert load_script(path).conversations, path


def test_the_turn_follows_the_conversation(seed_server: ScriptedLLMServer) -> None:
    first = _chat(seed_server, _conversation(), tools=TOOLS).json()
    message = first["choices"][0]["message"]
    assert first["object"] == "chat.completion"
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    call = message["tool_calls"][0]
    assert call["function"]["name"] == "write_file"
    assert json.loads(call["function"]["arguments"])["path"] == "squares.py"
    assert first["usage"]["prompt_tokens"] > 0 and first["usage"]["completion_tokens"] > 0

    second = _chat(seed_server, _conversation("ok"), tools=TOOLS).json()
    call = second["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"command": "python3 squares.py"}

    third = _chat(seed_server, _conversation("ok", "10 squared is 100\n"), tools=TOOLS).json()
    call = third["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "finish"
    assert "10 squared is 100" in json.loads(call["function"]["arguments"])["message"]


def test_the_same_conversation_gets_the_same_answer(seed_server: ScriptedLLMServer) -> None:
    a = _chat(seed_server, _conversation("x"), tools=TOOLS).json()
    b = _chat(seed_server, _conversation("x"), tools=TOOLS).json()
    assert a["choices"] == b["choices"]


def test_an_invalid_reply_report_counts_as_a_turn() -> None:
    script = parse_script(
        [
            {"tool": "execute_bash", "raw_arguments": '{"command": '},
            {"content": "second"},
        ]
    )
    with ScriptedLLMServer(script) as server:
        messages = _conversation()
        bad = _chat(server, messages, tools=TOOLS).json()["choices"][0]["message"]
        assert bad["tool_calls"][0]["function"]["arguments"] == '{"command": '
        messages.append({"role": "user", "content": "Your previous reply was invalid: bad JSON"})
        good = _chat(server, messages, tools=TOOLS).json()["choices"][0]
        assert good["message"]["content"] == "second" and good["finish_reason"] == "stop"


def test_without_tools_a_call_is_written_as_json_text(seed_server: ScriptedLLMServer) -> None:
    reply = _chat(seed_server, _conversation()).json()["choices"][0]
    assert reply["finish_reason"] == "stop" and "tool_calls" not in reply["message"]
    text = reply["message"]["content"]
    block = text.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(block)["tool"] == "write_file"


def test_conversations_are_chosen_by_the_task_and_exhausted_turns_repeat() -> None:
    script = parse_script(
        {
            "conversations": [{"match": "SUB-TASK", "turns": [{"content": "sub"}]}],
            "turns": [{"content": "main"}],
            "exhausted": {"content": "no more: {{turn}}"},
        }
    )
    with ScriptedLLMServer(script) as server:
        sub = [{"role": "user", "content": "a sub-task for you"}]
        assert _chat(server, sub).json()["choices"][0]["message"]["content"] == "sub"
        main = [{"role": "user", "content": "hello"}]
        assert _chat(server, main).json()["choices"][0]["message"]["content"] == "main"
        later = [*main, {"role": "assistant", "content": "main"}, {"role": "user", "content": "?"}]
        assert _chat(server, later).json()["choices"][0]["message"]["content"] == "no more: 2"


def test_scripted_failures_then_success() -> None:
    script = parse_script([{"content": "fine", "fail_first": {"status": 503, "times": 2}}])
    with ScriptedLLMServer(script) as server:
        messages = [{"role": "user", "content": "t"}]
        statuses = [_chat(server, messages).status_code for _ in range(3)]
        assert statuses == [503, 503, 200]


def test_streaming_answers_in_sse_chunks(seed_server: ScriptedLLMServer) -> None:
    response = _chat(
        seed_server,
        _conversation(),
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "write_file" and calls[0]["index"] == 0
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "tool_calls"
    assert chunks[-1]["usage"]["total_tokens"] > 0


def test_models_and_bad_requests(seed_server: ScriptedLLMServer) -> None:
    models = httpx.get(f"{seed_server.base_url}/models", timeout=5).json()
    assert models["data"][0]["id"] == "scripted"
    bad = httpx.post(f"{seed_server.base_url}/chat/completions", content=b"{nope", timeout=5)
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
    empty = _chat(seed_server, [])
    assert empty.status_code == 400
    assert httpx.get(f"{seed_server.base_url}/nothing", timeout=5).status_code == 404


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ([], "non-empty"),
        ([{"tol": "x"}], "unknown keys"),
        ([{}], "needs 'tool' or 'content'"),
        ([{"tool": "a", "arguments": {}, "raw_arguments": "{}"}], "not both"),
        ({"turns": [{"content": "x"}], "extra": 1}, "unknown top-level"),
        ([{"content": "x", "fail_first": {"status": 200}}], "HTTP error"),
    ],
)
def test_bad_scripts_are_refused_with_a_reason(raw: Any, problem: str) -> None:
    with pytest.raises(ScriptError, match=problem):
        parse_script(raw)
