"""From an LLM reply to one event: native tool calls, calls written as text, and bad replies."""

from __future__ import annotations

import json

import pytest

from services.reasoner.prompt import build_messages
from services.reasoner.replies import (
    FIRST_LOOK_THOUGHT,
    NO_TOOL_CALL,
    LLMReply,
    event_for_reply,
    first_look_event,
    llm_error_event,
    parse_text_tool_call,
    step_event_id,
)
from services.reasoner.tools import TOOL_ARGUMENTS, TOOL_SPECS, ToolCall
from shared.commands import StepRequest
from shared.events import (
    AgentDelegateAction,
    AgentFinishAction,
    AgentThinkAction,
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    EventAdapter,
    EventSource,
    FileReadAction,
    FileWriteAction,
    LLMUsage,
    MessageAction,
    RunPythonAction,
)

STEP = StepRequest(task_id="t1", after_seq=3, iteration=1)
USAGE = LLMUsage(model="openai/scripted", prompt_tokens=10, completion_tokens=5)


def _native(
    name: str, arguments: str, content: str = "", call_id: str | None = "call_9"
) -> LLMReply:
    return LLMReply(content=content, tool_calls=[ToolCall(name, arguments, call_id)], usage=USAGE)


@pytest.mark.parametrize(
    ("name", "arguments", "kind", "fields"),
    [
        (
            "execute_bash",
            {"command": "ls", "timeout": 30},
            CmdRunAction,
            {"command": "ls", "timeout_s": 30},
        ),
        ("execute_python", {"code": "print(1)"}, RunPythonAction, {"code": "print(1)"}),
        (
            "read_file",
            {"path": "a.py", "start_line": 2, "end_line": 4},
            FileReadAction,
            {"path": "a.py", "start_line": 2, "end_line": 4},
        ),
        (
            "write_file",
            {"path": "a.py", "content": "x"},
            FileWriteAction,
            {"path": "a.py", "content": "x"},
        ),
        ("think", {"thought": "plan"}, AgentThinkAction, {"thought": "plan"}),
        ("delegate", {"task": "sub"}, AgentDelegateAction, {"task": "sub"}),
        (
            "finish",
            {"message": "done", "outputs": {"a": 1}},
            AgentFinishAction,
            {"final_message": "done", "outputs": {"a": 1}},
        ),
    ],
)
def test_each_tool_becomes_its_action(name: str, arguments: dict, kind: type, fields: dict) -> None:
    event = event_for_reply(STEP, _native(name, json.dumps(arguments)), native=True)
    assert isinstance(event, kind) and not isinstance(event, ErrorObservation)
    for key, value in fields.items():
        assert getattr(event, key) == value
    assert event.source is EventSource.AGENT
    assert event.cause == STEP.id and event.task_id == "t1"
    assert event.tool_call_id == "call_9"
    assert event.llm_usage == USAGE
    assert event.id == step_event_id(STEP)
    # It round-trips through the one event union, as the controller will read it.
    assert EventAdapter.validate_json(event.model_dump_json()) == event


def test_the_event_id_is_the_same_for_a_redelivered_step() -> None:
    first = event_for_reply(STEP, _native("execute_bash", '{"command": "ls"}'), native=True)
    again = event_for_reply(STEP, _native("execute_bash", '{"command": "ls"}'), native=True)
    other = StepRequest(task_id="t1", after_seq=3, iteration=1)
    assert first.id == again.id != step_event_id(other)


def test_text_next_to_a_tool_call_is_the_thought_and_only_the_first_call_counts() -> None:
    reply = LLMReply(
        content="I will list files.",
        tool_calls=[
            ToolCall("execute_bash", '{"command": "ls"}', "c1"),
            ToolCall("execute_bash", '{"command": "pwd"}', "c2"),
        ],
        usage=USAGE,
    )
    event = event_for_reply(STEP, reply, native=True)
    assert isinstance(event, CmdRunAction)
    assert event.command == "ls" and event.thought == "I will list files."


def test_a_missing_call_id_is_made_up_from_the_event_id() -> None:
    event = event_for_reply(
        STEP, _native("execute_bash", '{"command": "ls"}', call_id=None), native=True
    )
    assert isinstance(event, CmdRunAction)
    assert event.tool_call_id and event.tool_call_id.startswith("call_")


@pytest.mark.parametrize(
    ("name", "arguments", "problem"),
    [
        ("execute_bash", '{"command": "ls', "not valid JSON"),
        ("frobnicate", '{"x": 1}', "no tool named 'frobnicate'"),
        ("execute_bash", "{}", "command: Field required"),
        ("write_file", '{"path": "a.py"}', "content: Field required"),
        ("execute_bash", '["ls"]', "must be a JSON object"),
        ("read_file", '{"path": "a", "start_line": 0}', "start_line"),
        ("execute_bash", '{"command": "ls", "timeout": 99999}', "timeout"),
    ],
)
def test_a_malformed_tool_call_becomes_an_error_observation(
    name: str, arguments: str, problem: str
) -> None:
    event = event_for_reply(STEP, _native(name, arguments), native=True)
    assert isinstance(event, ErrorObservation)
    assert event.error_code == "bad_llm_reply"
    assert problem in event.content
    assert event.cause == STEP.id and event.id == step_event_id(STEP)


def test_plain_text_is_a_question_for_the_user() -> None:
    event = event_for_reply(
        STEP, LLMReply(content="Which Python version?", usage=USAGE), native=True
    )
    assert isinstance(event, MessageAction)
    assert event.wait_for_response and event.content == "Which Python version?"
    assert event.source is EventSource.AGENT and event.tool_call_id is None


def test_prompt_based_text_that_asks_nothing_is_told_to_call_a_tool() -> None:
    # A small model's answer as plain text: nobody is asked anything, so waiting for a person
    # would end the task there.
    event = event_for_reply(STEP, LLMReply(content="The number is 6765."), native=False)
    assert isinstance(event, ErrorObservation) and event.error_code == "bad_llm_reply"
    assert event.content == NO_TOOL_CALL and "call finish" in event.content
    asked = event_for_reply(STEP, LLMReply(content="Which file do you mean?"), native=False)
    assert isinstance(asked, MessageAction) and asked.wait_for_response


def test_the_first_look_is_the_first_action_and_only_the_first() -> None:
    task = MessageAction(task_id="t1", source=EventSource.USER, content="Fix calc.py")
    event = first_look_event(STEP, [task], "ls -A")
    assert isinstance(event, CmdRunAction) and event.command == "ls -A"
    assert event.thought == FIRST_LOOK_THOUGHT and event.tool_call_id and event.llm_usage is None
    assert event.id == step_event_id(STEP)  # a redelivered step answers with the same id
    assert first_look_event(STEP, [task, event], "ls -A") is None  # the agent has acted
    assert first_look_event(STEP, [task], "") is None  # off by default


def test_the_first_look_is_shown_as_context_not_as_a_call_to_imitate() -> None:
    task = MessageAction(task_id="t1", source=EventSource.USER, content="Fix calc.py", seq=1)
    look = first_look_event(STEP, [task], "ls -A")
    assert isinstance(look, CmdRunAction) and look.on_agents_behalf
    listed = CmdOutputObservation(
        task_id="t1",
        source=EventSource.ENVIRONMENT,
        cause=look.id,
        command="ls -A",
        content="calc.py",
        exit_code=0,
        cwd="/workspace",
        seq=3,
    )
    for native in (True, False):
        messages = build_messages([task, look.model_copy(update={"seq": 2}), listed], native=native)
        assert [m["role"] for m in messages] == ["system", "user"], messages
        assert messages[1]["content"] == (
            "Fix calc.py\n\nThe working directory, /workspace, holds:\ncalc.py"
        )
        assert not any(m.get("tool_calls") for m in messages)
    empty = listed.model_copy(update={"content": ""})
    messages = build_messages([task, look.model_copy(update={"seq": 2}), empty], native=False)
    assert messages[1]["content"].endswith("The working directory, /workspace, is empty.")


def test_an_empty_reply_is_an_error() -> None:
    event = event_for_reply(STEP, LLMReply(content="  "), native=True)
    assert isinstance(event, ErrorObservation) and "empty" in event.content


# --- calls written as text -------------------------------------------------------------------


def test_native_mode_still_reads_a_json_call_written_in_the_text() -> None:
    # What Qwen2.5-Coder does with tool_choice=auto.
    text = 'Sure.\n{"name": "execute_bash", "arguments": {"command": "python3 sq.py"}}'
    event = event_for_reply(STEP, LLMReply(content=text, usage=USAGE), native=True)
    assert isinstance(event, CmdRunAction)
    assert event.command == "python3 sq.py" and event.thought == "Sure."
    assert event.tool_call_id


def test_native_mode_does_not_run_code_blocks_of_an_explanation() -> None:
    text = "You could run:\n```bash\nls -la\n```"
    event = event_for_reply(STEP, LLMReply(content=text), native=True)
    assert isinstance(event, MessageAction)


@pytest.mark.parametrize(
    ("text", "name", "arguments"),
    [
        (
            '{"tool": "execute_bash", "arguments": {"command": "ls"}}',
            "execute_bash",
            {"command": "ls"},
        ),
        (
            '```json\n{"tool": "write_file", "arguments": {"path": "a", "content": "b"}}\n```',
            "write_file",
            {"path": "a", "content": "b"},
        ),
        (
            'Plan:\n```\n{"name": "finish", "arguments": {"message": "ok"}}\n```\nbye',
            "finish",
            {"message": "ok"},
        ),
        (
            '{"name": "execute_bash", "arguments": "{\\"command\\": \\"ls\\"}"}',
            "execute_bash",
            '{"command": "ls"}',
        ),
        ('{"tool": "execute_bash", "command": "ls"}', "execute_bash", {"command": "ls"}),
        ("Run it:\n```bash\npython3 sq.py\n```", "execute_bash", {"command": "python3 sq.py"}),
        ("```python\nprint(1)\n```", "execute_python", {"code": "print(1)\n"}),
    ],
)
def test_prompt_based_calls_are_read_from_the_text(text: str, name: str, arguments: object) -> None:
    found = parse_text_tool_call(text, code_blocks=True)
    assert found is not None
    call, _rest = found
    assert call.name == name and call.arguments == arguments


def test_prompt_based_reply_becomes_an_action_with_the_surrounding_text_as_thought() -> None:
    text = (
        'I will write it.\n```json\n{"tool": "write_file", "arguments": '
        '{"path": "sq.py", "content": "print(1)"}}\n```'
    )
    event = event_for_reply(STEP, LLMReply(content=text, usage=USAGE), native=False)
    assert isinstance(event, FileWriteAction)
    assert event.path == "sq.py" and event.thought == "I will write it."


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"tool": "execute_bash", "arguments": {"command": "ls"\n```',
        '{"tool": "execute_bash", "arguments": {"command": ',
    ],
)
def test_broken_json_that_tries_to_call_a_tool_is_an_error(text: str) -> None:
    event = event_for_reply(STEP, LLMReply(content=text), native=False)
    assert isinstance(event, ErrorObservation)
    assert event.error_code == "bad_llm_reply" and "not valid JSON" in event.content


def test_ordinary_json_in_prose_is_not_a_call() -> None:
    text = 'The config is {"name": "demo", "port": 80}. Shall I change it?'
    assert parse_text_tool_call(text, code_blocks=True) is None
    event = event_for_reply(STEP, LLMReply(content=text), native=False)
    assert isinstance(event, MessageAction)


def test_unknown_tool_written_as_text_is_an_error() -> None:
    event = event_for_reply(
        STEP, LLMReply(content='{"tool": "browse", "arguments": {"url": "x"}}'), native=False
    )
    assert isinstance(event, ErrorObservation) and "browse" in event.content


def test_llm_error_event() -> None:
    event = llm_error_event(STEP, "Timeout")
    assert event.error_code == "llm_error" and event.id == step_event_id(STEP)
    assert event.cause == STEP.id


def test_tool_specs_and_argument_models_agree() -> None:
    for spec in TOOL_SPECS:
        fn = spec["function"]
        model = TOOL_ARGUMENTS[fn["name"]]
        required = {n for n, f in model.model_fields.items() if f.is_required()}
        assert set(fn["parameters"]["required"]) == required, fn["name"]
        assert set(fn["parameters"]["properties"]) == set(model.model_fields), fn["name"]
