"""The condenser: where it cuts, what the summary says, and the prompt a condensation leaves."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from services.reasoner.condenser import (
    Condensation,
    TokenCounter,
    plan_condensation,
    summarize,
    summary_lines,
)
from services.reasoner.prompt import (
    CONDENSED_PREFIX,
    build_messages,
    prompt_view,
    system_prompt,
)
from shared.events import (
    AgentState,
    AgentStateChangedObservation,
    AgentThinkAction,
    CmdOutputObservation,
    CmdRunAction,
    CondensationAction,
    ErrorObservation,
    EventSource,
    FileWriteAction,
    FileWriteObservation,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)

T = "task1"
USER, AGENT, ENV = EventSource.USER, EventSource.AGENT, EventSource.ENVIRONMENT
TASK = "Summarise the logs"


class CharCounter(TokenCounter):
    """Characters / 4: the same answer on every machine."""

    def __init__(self) -> None:
        super().__init__("test")

    def messages(self, messages: Sequence[dict[str, Any]]) -> int:
        return sum(len(json.dumps(m)) for m in messages) // 4

    def text(self, text: str) -> int:
        return len(text) // 4


def _seq(*events: Any) -> list[Any]:
    return [e.model_copy(update={"seq": i}) for i, e in enumerate(events, 1)]


def _long_task(steps: int = 8, output_chars: int = 400) -> list[Any]:
    """The task, then `steps` commands, each with a verdict and an output."""
    events: list[Any] = [
        MessageAction(task_id=T, source=USER, content=TASK),
        AgentStateChangedObservation(task_id=T, source=ENV, agent_state=AgentState.RUNNING),
    ]
    for i in range(1, steps + 1):
        run = CmdRunAction(
            task_id=T, source=AGENT, command=f"cat log{i}.txt", tool_call_id=f"call_{i}"
        )
        body = f"log {i} line\n" * (output_chars // 11)
        events += [
            run,
            SecurityVerdictObservation(
                task_id=T, source=ENV, cause=run.id, verdict=Verdict.ALLOW, risk=RiskLevel.LOW
            ),
            CmdOutputObservation(
                task_id=T,
                source=ENV,
                cause=run.id,
                command=run.command,
                content=body,
                exit_code=i % 2,
                cwd="/workspace",
            ),
        ]
    return _seq(*events)


def _plan(events: list[Any], *, native: bool = True, **overrides: Any) -> Condensation | None:
    view = prompt_view(events, native=native)
    options: dict[str, Any] = {
        "count": CharCounter(),
        "native": native,
        "budget": 1000,
        "target_fraction": 0.6,
        "keep_recent": 2,
        "max_summary_chars": 4000,
        **overrides,
    }
    return plan_condensation(view, summary_lines(events, view.task_seq), **options)


def _condensed(events: list[Any], plan: Condensation) -> list[Any]:
    condensation = CondensationAction(
        task_id=T,
        source=AGENT,
        cause="step-9",
        forgotten_up_to_seq=plan.forgotten_up_to_seq,
        summary=plan.summary,
    )
    return [*events, condensation.model_copy(update={"seq": len(events) + 1})]


def _commands(messages: list[dict[str, Any]]) -> list[str]:
    return [
        json.loads(call["function"]["arguments"])["command"]
        for m in messages
        for call in m.get("tool_calls") or []
    ]


def _assert_calls_paired(messages: list[dict[str, Any]]) -> None:
    """Every tool call is followed by its result, and every result follows its call."""
    for i, m in enumerate(messages):
        if m.get("tool_calls"):
            assert messages[i + 1]["role"] == "tool"
            assert messages[i + 1]["tool_call_id"] == m["tool_calls"][0]["id"]
        if m["role"] == "tool":
            assert messages[i - 1]["tool_calls"][0]["id"] == m["tool_call_id"]


def _tokens(messages: list[dict[str, Any]]) -> int:
    return CharCounter().messages(messages) + CharCounter().tools()


def test_a_prompt_within_the_budget_is_left_alone() -> None:
    events = _long_task(steps=2)
    assert _plan(events, budget=100_000) is None


def test_a_prompt_over_the_budget_forgets_the_oldest_steps() -> None:
    events = _long_task(output_chars=1500)
    before = build_messages(events, native=True)
    plan = _plan(events, budget=_tokens(before) - 1)
    assert plan is not None
    assert plan.tokens_before == _tokens(before)
    # Deep enough to leave room for the next steps, not just barely under the budget.
    assert plan.tokens_after <= int((plan.tokens_before - 1) * 0.6)
    # The cut falls just before an action, so a call and its result go (or stay) together.
    runs: dict[int, CmdRunAction] = {
        e.seq: e for e in events if isinstance(e, CmdRunAction) and e.seq is not None
    }
    assert plan.forgotten_up_to_seq + 1 in runs

    after = build_messages(_condensed(events, plan), native=True)
    assert after[0] == {"role": "system", "content": system_prompt(True)}
    assert after[1] == {"role": "user", "content": TASK}
    note = after[2]["content"]
    forgotten = [r for s, r in runs.items() if s <= plan.forgotten_up_to_seq]
    assert note.startswith(f"{CONDENSED_PREFIX} {len(forgotten)} earlier steps were condensed")
    assert "- ran `cat log1.txt` -> exit 1, " in note
    assert plan.summary in note
    kept = [r.command for s, r in runs.items() if s > plan.forgotten_up_to_seq]
    assert _commands(after) == kept
    assert kept[-2:] == ["cat log7.txt", "cat log8.txt"]  # the recent window
    _assert_calls_paired(after)
    # The plan's estimate is the prompt's size (counted chunk by chunk, so rounded per chunk).
    assert abs(_tokens(after) - plan.tokens_after) <= len(after)


def test_the_recent_window_is_never_condensed() -> None:
    events = _long_task(steps=3)
    plan = _plan(events, budget=1, keep_recent=2)
    assert plan is not None
    after = build_messages(_condensed(events, plan), native=True)
    assert _commands(after) == ["cat log2.txt", "cat log3.txt"]
    # Nothing left to condense: no second condensation, even when the prompt is still too long.
    assert _plan(_condensed(events, plan), budget=1, keep_recent=2) is None
    assert _plan(_condensed(events, plan), budget=1, keep_recent=2, force=True) is None


def test_a_context_window_error_forces_the_prompt_to_at_least_halve() -> None:
    events = _long_task(output_chars=1500)
    # No budget set: only the provider's refusal condenses.
    assert _plan(events, budget=0) is None
    plan = _plan(events, budget=0, force=True)
    assert plan is not None
    assert plan.tokens_after <= plan.tokens_before // 2


def test_the_latest_condensation_is_the_one_that_counts() -> None:
    events = _long_task()
    first = _plan(events, budget=_tokens(build_messages(events, native=True)) - 1)
    assert first is not None
    once = _condensed(events, first)
    # More steps, then a second, deeper condensation.
    second = _plan(once, budget=1, keep_recent=1)
    assert second is not None and second.forgotten_up_to_seq > first.forgotten_up_to_seq
    twice = _condensed(once, second)
    messages = build_messages(twice, native=True)
    assert _commands(messages) == ["cat log8.txt"]
    assert messages[2]["content"].startswith(f"{CONDENSED_PREFIX} 7 earlier steps")
    # The new summary covers everything forgotten, the first condensation's steps included.
    assert "cat log1.txt" in second.summary and "cat log7.txt" in second.summary


def test_a_cut_between_a_call_and_its_result_drops_both() -> None:
    events = _long_task(steps=3)
    run2 = next(e for e in events if isinstance(e, CmdRunAction) and e.command == "cat log2.txt")
    assert run2.seq is not None
    # A cut (made by another condenser, say) that keeps run 2's output but not run 2.
    condensation = CondensationAction(
        task_id=T, source=AGENT, forgotten_up_to_seq=run2.seq, summary="- ran two commands"
    ).model_copy(update={"seq": len(events) + 1})
    messages = build_messages([*events, condensation], native=True)
    assert _commands(messages) == ["cat log3.txt"]
    assert not any("log 2 line" in str(m.get("content")) for m in messages)
    _assert_calls_paired(messages)


def test_prompt_based_mode_gets_the_same_note() -> None:
    events = _long_task()
    plan = _plan(events, native=False, budget=1, keep_recent=1)
    assert plan is not None
    messages = build_messages(_condensed(events, plan), native=False)
    assert messages[2]["role"] == "user"
    assert messages[2]["content"].startswith(f"{CONDENSED_PREFIX} 7 earlier steps")
    assert [m["role"] for m in messages[3:]] == ["assistant", "user"]


def test_the_summary_says_what_each_step_did_and_how_it_ended() -> None:
    write = FileWriteAction(
        task_id=T, source=AGENT, path="a.py", content="print(1)\n", tool_call_id="c1"
    )
    denied = CmdRunAction(task_id=T, source=AGENT, command="rm -rf /", tool_call_id="c2")
    think = AgentThinkAction(task_id=T, source=AGENT, thought="Next, test it.", tool_call_id="c3")
    events = _seq(
        MessageAction(task_id=T, source=USER, content=TASK),
        write,
        FileWriteObservation(task_id=T, source=ENV, cause=write.id, path="a.py"),
        denied,
        ErrorObservation(
            task_id=T,
            source=ENV,
            cause=denied.id,
            error_code="security_denied",
            content="The security monitor denied this action",
        ),
        think,
        ErrorObservation(
            task_id=T,
            source=AGENT,
            cause="step-4",
            error_code="bad_llm_reply",
            content="the tool call is not valid JSON",
        ),
        MessageAction(task_id=T, source=USER, content="Use /tmp instead."),
        AgentStateChangedObservation(task_id=T, source=ENV, agent_state=AgentState.RUNNING),
        CondensationAction(task_id=T, source=AGENT, forgotten_up_to_seq=1),
    )
    lines = [text for _, text in summary_lines(events, task_seq=1)]
    assert lines == [
        "- wrote a.py (9 chars) -> written",
        "- ran `rm -rf /` -> error: The security monitor denied this action",
        "- thought: Next, test it.",
        "- your reply was invalid: the tool call is not valid JSON",
        "- the user said: Use /tmp instead.",
    ]


def test_an_output_is_summed_up_by_its_size_and_its_end() -> None:
    run = CmdRunAction(task_id=T, source=AGENT, command="pytest", tool_call_id="c1")
    output = "collecting\n" * 300 + "FAILED test_a.py::test_x - assert 1 == 2\n"
    events = _seq(
        MessageAction(task_id=T, source=USER, content=TASK),
        run,
        CmdOutputObservation(
            task_id=T,
            source=ENV,
            cause=run.id,
            command="pytest",
            content=output,
            exit_code=1,
            cwd="/workspace",
        ),
    )
    [(seq, line)] = summary_lines(events, task_seq=1)
    assert seq == 2
    assert line.startswith(f"- ran `pytest` -> exit 1, {len(output)} chars of output ending")
    assert line.endswith('FAILED test_a.py::test_x - assert 1 == 2"')
    assert len(line) <= 300


@pytest.mark.parametrize("max_chars", [200, 1000, 4000])
def test_the_summary_is_bounded_and_keeps_the_newest_lines(max_chars: int) -> None:
    lines = [(i, f"- ran `step {i}` -> exit 0, {i * 10} chars of output") for i in range(1, 301)]
    summary = summarize(lines, up_to_seq=250, max_chars=max_chars)
    assert len(summary) <= max_chars
    kept = summary.splitlines()
    assert kept[-1] == lines[249][1]  # the newest line up to the cut
    assert kept[0] == f"- ({250 - (len(kept) - 1)} earlier steps not shown)"
    assert summarize(lines[:3], up_to_seq=2, max_chars=max_chars) == "\n".join(
        text for _, text in lines[:2]
    )
