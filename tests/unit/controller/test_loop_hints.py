"""Loops end with a hint, not by exhaustion (issue 29, item 2): an agent that edits, runs the
same failing script, edits again... is told what repeats and how to get out (for a script run
without its interpreter, how to run it); only a loop that forms again after the hint ends the
task, with the pattern as its reason. What the system ran for the agent is no step of its own
(item 3)."""

from __future__ import annotations

from live_log import TASK, Live, new_task  # type: ignore[import-not-found]

from services.controller.loop_hints import loop_hint
from services.controller.rebuild import rebuild_state
from services.controller.stuck import LoopPolicy, detect
from services.controller.turn import Turn
from shared.commands import StepRequest
from shared.events import (
    AgentState,
    CmdOutputObservation,
    CmdRunAction,
    EventSource,
    FileEditAction,
    FileEditObservation,
    LoopHintObservation,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import Awaiting

DENIED = "bash: ./fib.py: Permission denied"


def _ran(
    live: Live,
    action: CmdRunAction | FileEditAction,
    output: CmdOutputObservation | FileEditObservation,
) -> Turn:
    live.feed(action)
    live.feed(
        SecurityVerdictObservation(
            task_id=TASK,
            source=EventSource.ENVIRONMENT,
            cause=action.id,
            verdict=Verdict.ALLOW,
            risk=RiskLevel.LOW,
        )
    )
    return live.feed(output.model_copy(update={"cause": action.id}))


def _edit(live: Live, n: int) -> Turn:
    edit = FileEditAction(
        task_id=TASK,
        source=EventSource.AGENT,
        cause=live.step_id,
        command="str_replace",
        path="/workspace/fib.py",
        old_str=f"v{n}",
        new_str=f"v{n + 1}",
    )
    done = FileEditObservation(
        task_id=TASK, source=EventSource.ENVIRONMENT, path=edit.path, content=f"edited {n}"
    )
    return _ran(live, edit, done)


def _run_fib(live: Live) -> Turn:
    run = CmdRunAction(
        task_id=TASK, source=EventSource.AGENT, cause=live.step_id, command="./fib.py"
    )
    denied = CmdOutputObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        command="./fib.py",
        content=DENIED,
        exit_code=126,
        cwd="/workspace",
    )
    return _ran(live, run, denied)


def _hints(live: Live) -> list[LoopHintObservation]:
    return [e for e in live.log if isinstance(e, LoopHintObservation)]


def test_edits_between_the_same_failing_run_get_a_hint_then_end_the_task() -> None:
    live = new_task(max_iterations=30)
    for n in range(2):
        _edit(live, n)
        _run_fib(live)
    assert not _hints(live) and live.state.agent_state is AgentState.RUNNING
    _edit(live, 2)
    turn = _run_fib(live)  # the third identical failure, edits between
    [hint] = _hints(live)
    assert hint.pattern.startswith("repeating result") and hint.hints_given == 1
    assert "python3 fib.py" in hint.hint and "chmod +x fib.py" in hint.hint, hint.hint
    assert DENIED in hint.hint
    # The agent goes on, told: the next step is asked for after the hint.
    assert live.state.agent_state is AgentState.RUNNING and live.state.awaiting is Awaiting.AGENT
    [step] = [m for _, m in turn.sent if isinstance(m, StepRequest)]
    assert step.after_seq == hint.seq  # the agent's next prompt holds the hint
    assert hint.model_dump(mode="json") in step.events
    assert live.state.loop_hints == 1 and live.state.recent == []

    # It does not listen: the loop forms again, and ends the task.
    for n in range(3, 5):
        _edit(live, n)
        _run_fib(live)
    assert live.state.agent_state is AgentState.RUNNING
    _edit(live, 5)
    _run_fib(live)
    assert live.state.agent_state is AgentState.ERROR
    assert live.state.reason.startswith("stuck in a loop: repeating result"), live.state.reason
    assert "after the agent was told" in live.state.reason
    assert len(_hints(live)) == 1

    # The log alone gives the same State.
    rebuilt = rebuild_state(live.log)
    assert (rebuilt.agent_state, rebuilt.loop_hints, rebuilt.reason) == (
        AgentState.ERROR,
        1,
        live.state.reason,
    )


def test_without_hints_the_first_loop_ends_the_task() -> None:
    live = new_task(max_iterations=30)
    live.loop = LoopPolicy(repeats=3, hints=0)
    for n in range(3):
        _edit(live, n)
        _run_fib(live)
    assert live.state.agent_state is AgentState.ERROR and not _hints(live)
    assert "after the agent was told" not in live.state.reason


def test_a_user_message_gives_the_agent_its_hints_again() -> None:
    live = new_task(max_iterations=30)
    for n in range(3):
        _edit(live, n)
        _run_fib(live)
    assert live.state.loop_hints == 1
    live.feed(MessageAction(task_id=TASK, source=EventSource.USER, content="run it with python3"))
    assert live.state.loop_hints == 0 and live.state.recent == []


def test_the_first_look_is_not_the_agents_step() -> None:
    live = new_task(max_iterations=30)
    for _ in range(5):
        look = CmdRunAction(
            task_id=TASK,
            source=EventSource.AGENT,
            cause=live.step_id,
            command="find . -maxdepth 3",
            on_agents_behalf=True,
        )
        same = CmdOutputObservation(
            task_id=TASK,
            source=EventSource.ENVIRONMENT,
            command=look.command,
            content="./a.txt",
            exit_code=0,
            cwd="/workspace",
        )
        _ran(live, look, same)
    assert live.state.recent == [] and not _hints(live)


def test_the_repeating_result_pattern() -> None:
    loop = ["A:e1", "O:e1", "A:run", "E:x", "A:e2", "O:e2", "A:run", "E:x", "A:e3", "O:e3"]
    assert detect(loop) is None
    assert (detect([*loop, "A:run", "E:x"]) or "").startswith("repeating error")
    # Identical steps in a row are seed 002's pattern, not this one.
    assert detect(["A:run", "O:x"] * 3) is None
    assert detect([*loop, "A:run", "E:x"], repeats=4) is None
    # Different results are progress.
    assert detect(["A:e1", "O:e1", "A:run", "O:1", "A:e2", "O:e2", "A:run", "O:2"] * 2) is None


def test_a_hint_on_a_repeating_traceback_names_where_it_is_raised() -> None:
    """The 1.5B model renamed a function in shapes.py and edited shapes.py again and again
    while the traceback named main.py's import: the hint names that file and line."""
    output = CmdOutputObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        command="python main.py",
        content='Traceback (most recent call last):\n  File "/workspace/main.py", line 1, in '
        "<module>\n    from shapes import sq_area\nImportError: cannot import name 'sq_area'",
        exit_code=1,
        cwd="/workspace",
    )
    hint = loop_hint("repeating result", [output])
    assert "`python main.py` exited with 1: Traceback" in hint
    assert "raised in main.py, line 1 (`from shapes import sq_area`)" in hint
    assert "raised in" not in loop_hint(
        "repeating result",
        [
            output.model_copy(
                update={"content": 'File "/usr/lib/python3/x.py", line 3, in f\n    boom()'}
            )
        ],
    )  # only the workspace's own files are named
    quiet = output.model_copy(update={"command": "grep age users.json > names.txt", "content": ""})
    assert "`grep age users.json > names.txt` exited with 1 and printed nothing (its output " in (
        loop_hint("repeating result", [quiet])
    )
