"""What small local models write instead of a clean tool call, and how it is still understood."""

from __future__ import annotations

from services.reasoner.replies import parse_text_tool_call
from services.reasoner.tools import ToolCall, action_for_call
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
