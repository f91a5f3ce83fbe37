"""The prompt builder: a task's events become a conversation a provider accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.reasoner.errors import NoTaskError
from services.reasoner.prompt import (
    INVALID_REPLY_PREFIX,
    REPEATED_FAILURE,
    build_messages,
    system_prompt,
)
from services.reasoner.tools import TOOL_NAMES
from shared.events import (
    AgentDelegateAction,
    AgentDelegateObservation,
    AgentFinishAction,
    AgentState,
    AgentStateChangedObservation,
    AgentThinkAction,
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    EventSource,
    FileWriteAction,
    FileWriteObservation,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    UserRejectObservation,
    Verdict,
)

T = "task1"
USER, AGENT, ENV, SYSTEM = (
    EventSource.USER,
    EventSource.AGENT,
    EventSource.ENVIRONMENT,
    EventSource.SYSTEM,
)


def _seq(*events: Any) -> list[Any]:
    return [e.model_copy(update={"seq": i}) for i, e in enumerate(events, 1)]


def _task(content: str = "Print the squares") -> MessageAction:
    return MessageAction(task_id=T, source=USER, content=content)


def _run(command: str, call_id: str = "call_1", thought: str = "") -> CmdRunAction:
    return CmdRunAction(
        task_id=T,
        source=AGENT,
        command=command,
        tool_call_id=call_id,
        thought=thought,
        cause="step-x",
    )


def _output(action: CmdRunAction, content: str, exit_code: int = 0) -> CmdOutputObservation:
    return CmdOutputObservation(
        task_id=T,
        source=ENV,
        cause=action.id,
        command=action.command,
        content=content,
        exit_code=exit_code,
        cwd="/workspace",
    )


def _assert_tool_calls_answered(messages: list[dict[str, Any]]) -> None:
    """What providers check: every tool call is followed at once by exactly one tool message."""
    for i, msg in enumerate(messages):
        if msg["role"] == "tool":
            prev = messages[i - 1]
            assert prev["role"] == "assistant" and prev.get("tool_calls"), messages
            assert prev["tool_calls"][0]["id"] == msg["tool_call_id"]
        if msg.get("tool_calls"):
            assert len(msg["tool_calls"]) == 1
            nxt = messages[i + 1]
            assert nxt["role"] == "tool" and nxt["tool_call_id"] == msg["tool_calls"][0]["id"]


def test_starts_with_a_short_system_prompt_and_the_task() -> None:
    messages = build_messages(_seq(_task()), native=True)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == "Print the squares"
    # Small local models pay for every prompt token; keep the native system prompt tiny.
    assert len(messages[0]["content"]) < 600


def test_a_tool_call_is_followed_by_its_observation() -> None:
    write = FileWriteAction(
        task_id=T,
        source=AGENT,
        path="sq.py",
        content="print(1)\n",
        tool_call_id="call_w",
        thought="Writing it.",
    )
    run = _run("python3 sq.py", "call_r")
    events = _seq(
        _task(),
        AgentStateChangedObservation(task_id=T, source=SYSTEM, agent_state=AgentState.RUNNING),
        write,
        SecurityVerdictObservation(
            task_id=T,
            source=ENV,
            cause=write.id,
            verdict=Verdict.ALLOW,
            risk=RiskLevel.LOW,
        ),
        FileWriteObservation(task_id=T, source=ENV, cause=write.id, path="sq.py"),
        run,
        _output(run, "1\n"),
    )
    messages = build_messages(events, native=True)
    _assert_tool_calls_answered(messages)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    call = messages[2]["tool_calls"][0]
    assert messages[2]["content"] == "Writing it."
    assert call["function"]["name"] == "write_file"
    assert json.loads(call["function"]["arguments"]) == {"path": "sq.py", "content": "print(1)\n"}
    assert messages[3]["content"] == "Wrote sq.py (1 line)"
    assert messages[5]["content"] == "1\n[exit code 0, cwd /workspace]"


def _write(content: str, note: str = "") -> list[Any]:
    write = FileWriteAction(
        task_id=T, source=AGENT, path="notes.txt", content=content, tool_call_id="call_w"
    )
    answer = FileWriteObservation(
        task_id=T,
        source=ENV,
        cause=write.id,
        path="/workspace/notes.txt",
        content=f"Wrote {len(content)} bytes to /workspace/notes.txt{note}",
    )
    return build_messages(_seq(_task(), write, answer), native=False)


def test_a_write_says_how_many_lines_it_made_and_a_missing_last_newline() -> None:
    whole = _write("alpha\nbeta\ngamma\n")[-1]["content"]
    assert whole.endswith("Wrote 17 bytes to /workspace/notes.txt (3 lines)")
    # wc -l counts newlines: without the last one it says 2, and models report what wc says.
    cut = _write("alpha\nbeta\ngamma")[-1]["content"]
    assert cut.endswith("(3 lines; the last has no newline at its end, so wc -l counts 2)")
    assert _write("")[-1]["content"].endswith("(empty)")
    # The runtime's note on what the write replaced follows the count, on its own line.
    same = _write("alpha\n", "\nThe file already held exactly this, so nothing changed.")
    assert same[-1]["content"].endswith(
        "Wrote 6 bytes to /workspace/notes.txt (1 line)\n"
        "The file already held exactly this, so nothing changed."
    )


def test_a_command_that_printed_nothing_says_so() -> None:
    run = _run("touch a")
    messages = build_messages(_seq(_task(), run, _output(run, "")), native=True)
    assert messages[-1]["content"] == "(no output)\n[exit code 0, cwd /workspace]"


def test_an_edit_whose_old_str_is_not_in_the_file_says_to_read_the_file() -> None:
    run = _run("edit")
    failed = ErrorObservation(
        task_id=T,
        source=ENV,
        cause=run.id,
        error_code="no_match",
        content="old_str was not found in /workspace/calc.py; nothing was changed",
    )
    text = build_messages(_seq(_task(), run, failed), native=True)[-1]["content"]
    assert text.startswith("ERROR: old_str was not found")
    assert "read_file" in text and "exactly" in text


def test_a_call_that_failed_before_and_fails_again_says_so() -> None:
    events: list[Any] = [_task()]
    for n in range(3):
        run = _run("python nope.py", call_id=f"call_{n}")
        events += [run, _output(run, "can't open file", exit_code=2)]
        read = _run("cat nope.py", call_id=f"read_{n}")
        failed = ErrorObservation(task_id=T, source=ENV, cause=read.id, content="no such file")
        events += [read, failed]
    results = [
        m["content"] for m in build_messages(_seq(*events), native=True)[2:] if m["role"] == "tool"
    ]
    # The failed cat is repeated: its 2nd and 3rd results say so; the first does not, and a
    # command that ran (with a non-zero exit) is not an error and never does.
    noted = [REPEATED_FAILURE in text for text in results]
    assert noted == [False, False, False, True, False, True]


def test_the_system_prompt_says_where_the_agent_is_what_it_has_and_to_check_its_work() -> None:
    text = system_prompt(native=True)
    assert "/workspace" in text
    assert all(tool in text for tool in ("python", "pytest", "git", "jq"))
    assert "fix it and run again" in text and "yourself" in text
    assert "Do small tasks yourself" in system_prompt(native=False)  # the delegate tool


def test_denied_action_is_answered_by_the_controllers_error_not_the_verdict() -> None:
    run = _run("rm -rf /")
    verdict = SecurityVerdictObservation(
        task_id=T,
        source=ENV,
        cause=run.id,
        verdict=Verdict.DENY,
        risk=RiskLevel.HIGH,
        rule="delete_root",
        reason="deletes the root",
    )
    error = ErrorObservation(
        task_id=T,
        source=ENV,
        cause=run.id,
        error_code="security_denied",
        content="The security monitor denied this action",
    )
    messages = build_messages(_seq(_task(), run, verdict, error), native=True)
    _assert_tool_calls_answered(messages)
    assert messages[-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "ERROR: The security monitor denied this action",
    }


def test_an_error_pointing_at_the_verdict_still_answers_the_action() -> None:
    run = _run("rm -rf /")
    verdict = SecurityVerdictObservation(
        task_id=T,
        source=ENV,
        cause=run.id,
        verdict=Verdict.DENY,
        risk=RiskLevel.HIGH,
    )
    error = ErrorObservation(task_id=T, source=ENV, cause=verdict.id, content="denied")
    messages = build_messages(_seq(_task(), run, verdict, error), native=True)
    _assert_tool_calls_answered(messages)
    assert messages[-1]["content"] == "ERROR: denied"


def test_missing_observations_get_a_placeholder_and_a_user_message_waits_its_turn() -> None:
    run = _run("sleep 100")
    think = AgentThinkAction(task_id=T, source=AGENT, thought="plan", tool_call_id="call_t")
    user = MessageAction(task_id=T, source=USER, content="hurry up")
    # The user spoke while the command ran: its output comes after the message in the log.
    events = _seq(_task(), run, user, _output(run, "done"), think)
    messages = build_messages(events, native=True)
    _assert_tool_calls_answered(messages)
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool"]
    assert messages[3]["content"].startswith("done")
    assert messages[4]["content"] == "hurry up"
    assert messages[6]["content"] == "Your thought has been recorded."


def test_an_invalid_reply_is_reported_to_the_model_as_a_user_message() -> None:
    bad = ErrorObservation(
        task_id=T,
        source=AGENT,
        cause="a-step-id",
        error_code="bad_llm_reply",
        content="there is no tool named 'frob'",
    )
    messages = build_messages(_seq(_task(), bad), native=True)
    assert messages[-1]["role"] == "user"
    assert messages[-1]["content"].startswith(INVALID_REPLY_PREFIX)
    assert "frob" in messages[-1]["content"]


def test_llm_errors_and_refusals_of_user_requests_are_not_shown_to_the_model() -> None:
    user = MessageAction(task_id=T, source=USER, content="again")
    events = _seq(
        _task(),
        ErrorObservation(
            task_id=T, source=SYSTEM, cause="step", error_code="llm_error", content="down"
        ),
        user,
        ErrorObservation(
            task_id=T, source=ENV, cause=user.id, error_code="illegal_transition", content="Refused"
        ),
    )
    messages = build_messages(events, native=True)
    assert [m["content"] for m in messages[1:]] == ["Print the squares", "again"]


def test_agent_question_and_user_answer() -> None:
    question = MessageAction(task_id=T, source=AGENT, content="Which file?", wait_for_response=True)
    answer = MessageAction(task_id=T, source=USER, content="sq.py")
    messages = build_messages(_seq(_task(), question, answer), native=True)
    assert messages[2:] == [
        {"role": "assistant", "content": "Which file?"},
        {"role": "user", "content": "sq.py"},
    ]


def test_finish_delegate_and_rejection_are_rendered() -> None:
    finish = AgentFinishAction(
        task_id=T,
        source=AGENT,
        final_message="done",
        tool_call_id="call_f",
        outputs={"n": 1},
    )
    delegate = AgentDelegateAction(task_id=T, source=AGENT, task="sub", tool_call_id="call_d")
    run = _run("ls", "call_r")
    events = _seq(
        _task(),
        finish,
        MessageAction(task_id=T, source=USER, content="one more thing"),
        delegate,
        AgentDelegateObservation(
            task_id=T,
            source=ENV,
            cause=delegate.id,
            sub_task_id="s",
            agent_state=AgentState.FINISHED,
            content="sub done",
            outputs={"x": 2},
        ),
        run,
        UserRejectObservation(task_id=T, source=USER, cause=run.id),
    )
    messages = build_messages(events, native=True)
    _assert_tool_calls_answered(messages)
    args = json.loads(messages[2]["tool_calls"][0]["function"]["arguments"])
    assert args == {"message": "done", "outputs": {"n": 1}}
    assert messages[3]["content"] == "The task was marked as finished."
    assert "sub done" in messages[6]["content"] and '"x": 2' in messages[6]["content"]
    assert messages[8]["content"].startswith("REJECTED")


def test_long_outputs_are_cut_in_the_middle() -> None:
    run = _run("yes")
    output = "HEAD" + "y\n" * 5000 + "TAIL"
    messages = build_messages(
        _seq(_task(), run, _output(run, output)), native=True, max_observation_chars=500
    )
    text = messages[-1]["content"]
    assert text.startswith("HEAD") and "TAIL" in text and "characters omitted" in text
    assert len(text) < 700


def test_prompt_based_mode_describes_the_tools_and_uses_plain_messages() -> None:
    run = _run("ls", thought="Looking.")
    messages = build_messages(_seq(_task(), run, _output(run, "a.py")), native=False)
    system = messages[0]["content"]
    assert all(name in system for name in TOOL_NAMES)
    assert system == system_prompt(native=False)
    assert all("tool_calls" not in m and m["role"] != "tool" for m in messages)
    assert messages[2]["role"] == "assistant"
    assert messages[2]["content"].startswith("Looking.")
    call = json.loads(messages[2]["content"].split("\n", 1)[1])
    assert call == {"tool": "execute_bash", "arguments": {"command": "ls"}}
    assert messages[3]["role"] == "user" and "a.py" in messages[3]["content"]


def test_a_history_without_the_task_cannot_be_prompted() -> None:
    with pytest.raises(NoTaskError):
        build_messages(_seq(_run("ls")), native=True)
