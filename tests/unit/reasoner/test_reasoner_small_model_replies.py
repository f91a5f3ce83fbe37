"""What small local models write instead of a clean tool call, and how it is still understood."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.reasoner.errors import BadReply
from services.reasoner.prompt import system_prompt
from services.reasoner.replies import parse_text_tool_call
from services.reasoner.tools import (
    ToolCall,
    action_for_call,
    describe_tools,
    tool_offered,
    withhold_tools,
)
from shared.events import EventSource, RunPythonAction


def test_a_call_without_a_tool_name_is_matched_by_its_arguments() -> None:
    found = parse_text_tool_call('{"message": "done", "outputs": {}}', code_blocks=True)
    assert found is not None and found[0].name == "finish"


def test_json_that_fits_no_tool_is_not_a_call() -> None:
    assert parse_text_tool_call('{"colour": "blue", "size": 3}', code_blocks=True) is None


def test_python_triple_quoted_strings_in_a_json_block_are_repaired() -> None:
    text = (
        '```json\n{"tool": "write_file", '
        '"arguments": {"path": "a.py", "content": """print(1)\n"""}}\n```'
    )
    found = parse_text_tool_call(text, code_blocks=True)
    assert found is not None
    call, _ = found
    assert call.name == "write_file"


def test_the_thought_is_the_text_before_the_call_without_tags() -> None:
    text = (
        'I will run it. <tools>{"tool": "execute_bash", "arguments": {"command": "ls"}}</tools>'
        " a.py"
    )
    found = parse_text_tool_call(text, code_blocks=True)
    assert found is not None
    call, thought = found
    assert call.name == "execute_bash"
    assert "<tools>" not in thought and "a.py" not in thought


def test_a_python_snippet_indented_as_a_whole_runs_dedented() -> None:
    call = ToolCall("execute_python", {"code": "    for i in range(3):\n        print(i)\n"})
    action = action_for_call(call, {"task_id": "t", "source": EventSource.AGENT})
    assert isinstance(action, RunPythonAction)
    assert action.code == "for i in range(3):\n    print(i)\n"


@pytest.fixture
def small_model_tools() -> Iterator[None]:
    withhold_tools(["execute_python", "delegate"])
    try:
        yield
    finally:
        withhold_tools([])


def test_withheld_tools_are_not_described_and_a_call_to_one_is_refused(
    small_model_tools: None,
) -> None:
    assert not tool_offered("execute_python") and not tool_offered("delegate")
    prompt = system_prompt(native=False)
    assert "execute_python" not in prompt and "delegate" not in prompt
    with pytest.raises(BadReply, match=r"no tool named 'execute_python'.*execute_bash"):
        action_for_call(ToolCall("execute_python", {"code": "print(1)"}), {})
    with pytest.raises(BadReply, match="no tool named 'delegate'"):
        action_for_call(ToolCall("delegate", {"task": "do it"}), {})
    # A ```python block is no longer run as a snippet: the model is told what to do instead.
    with pytest.raises(BadReply, match="write_file"):
        parse_text_tool_call("```python\nprint(1)\n```", code_blocks=True)


def test_withheld_tools_come_back_in_their_place() -> None:
    before = describe_tools()
    withhold_tools(["delegate", "execute_python"])
    withhold_tools(["delegate"])
    assert tool_offered("execute_python") and not tool_offered("delegate")
    withhold_tools([])
    assert describe_tools() == before


def test_execute_bash_and_finish_cannot_be_withheld() -> None:
    with pytest.raises(ValueError, match="cannot withhold"):
        withhold_tools(["finish"])
    with pytest.raises(ValueError, match="cannot withhold"):
        withhold_tools(["browse"])


def test_the_tool_list_shows_the_values_an_enum_takes() -> None:
    assert '"command": "view"|"create"|"str_replace"|"insert"|"undo"' in describe_tools()
