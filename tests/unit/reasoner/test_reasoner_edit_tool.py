"""The file editor and bash-input tools map to their actions and back."""

from __future__ import annotations

import json

import pytest

from services.reasoner.errors import BadReply
from services.reasoner.tools import ToolCall, action_for_call, call_for_action
from shared.events import CmdRunAction, FileEditAction

FIELDS = {"task_id": "t", "source": "AGENT", "cause": "s"}


def test_edit_file_becomes_a_file_edit_action_and_round_trips() -> None:
    args = {"command": "str_replace", "path": "a.py", "old_str": "x = 1", "new_str": "x = 2"}
    action = action_for_call(ToolCall("edit_file", json.dumps(args)), FIELDS)
    assert isinstance(action, FileEditAction)
    assert (action.command, action.old_str, action.new_str) == ("str_replace", "x = 1", "x = 2")
    assert call_for_action(action) == ("edit_file", args)


def test_edit_file_with_an_unknown_command_is_a_bad_reply() -> None:
    with pytest.raises(BadReply, match="command"):
        action_for_call(ToolCall("edit_file", {"command": "delete", "path": "a.py"}), FIELDS)


def test_bash_input_may_be_empty_but_a_command_may_not() -> None:
    ctrl_c = action_for_call(ToolCall("execute_bash", {"command": "C-c", "is_input": True}), FIELDS)
    assert isinstance(ctrl_c, CmdRunAction) and ctrl_c.is_input
    wait = action_for_call(ToolCall("execute_bash", {"command": "", "is_input": True}), FIELDS)
    assert isinstance(wait, CmdRunAction) and wait.command == ""
    with pytest.raises(BadReply, match="empty"):
        action_for_call(ToolCall("execute_bash", {"command": ""}), FIELDS)
