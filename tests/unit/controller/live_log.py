"""The controller's turns driven in memory as the live controller runs them, keeping the log they
write: for tests that rebuild or fork a State from that log."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from services.controller.agent_loop import apply
from services.controller.stuck import LoopPolicy
from services.controller.turn import Turn
from shared.events import (
    CmdOutputObservation,
    CmdRunAction,
    EventBase,
    EventSource,
    LLMUsage,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
    WorkspaceCheckpointObservation,
)
from shared.state import Awaiting, TaskState

__all__ = ["TASK", "Live", "new_task"]

TASK = "t-rebuild"


class Live:
    """The controller's turns, in memory: the State it saves and the log it writes."""

    def __init__(self, state: TaskState) -> None:
        self.state = state
        self.log: list[EventBase] = []
        self.turns: list[Turn] = []
        self.loop: LoopPolicy | None = None  # the controller's loop settings (default: its own)

    def feed(self, event: EventBase) -> Turn:
        turn = Turn(self.state, loop=self.loop)
        apply(turn, event)
        turn.update(**turn.state.record_input(event.id, turn.outbox()))
        self.state = turn.state
        self.log += turn.logged
        self.turns.append(turn)
        return turn

    @property
    def step_id(self) -> str:
        assert self.state.awaiting is Awaiting.AGENT and self.state.awaiting_id
        return self.state.awaiting_id

    def agent(self, action: EventBase) -> Turn:
        return self.feed(action)

    def command(self, command: str, output: str = "ok\n") -> CmdRunAction:
        """The agent runs `command`, security allows it and the runtime answers."""
        action = self.run(command)
        self.allow(action)
        self.output(action, output)
        return action

    def run(self, command: str) -> CmdRunAction:
        action = CmdRunAction(
            task_id=self.state.task_id,
            source=EventSource.AGENT,
            cause=self.step_id,
            command=command,
            llm_usage=LLMUsage(model="m", prompt_tokens=100, completion_tokens=7, cost_usd=0.01),
        )
        self.feed(action)
        return action

    def allow(self, action: CmdRunAction, risk: RiskLevel = RiskLevel.LOW) -> None:
        self.feed(
            SecurityVerdictObservation(
                task_id=self.state.task_id,
                source=EventSource.ENVIRONMENT,
                cause=action.id,
                verdict=Verdict.ALLOW,
                risk=risk,
            )
        )

    def output(self, action: CmdRunAction, output: str) -> None:
        self.feed(
            CmdOutputObservation(
                task_id=self.state.task_id,
                source=EventSource.ENVIRONMENT,
                cause=action.id,
                command=action.command,
                content=output,
                exit_code=0,
                cwd="/workspace",
                runtime_replica="node-a",  # where the task's next orders go
            )
        )

    def seq_of(self, event_id: str) -> int:
        """The seq the log gave the event."""
        seq = next(e.seq for e in self.log if e.id == event_id)
        assert seq is not None
        return seq

    def output_seq(self, action: CmdRunAction) -> int:
        """The seq of the command's output."""
        seq = next(
            e.seq for e in self.log if isinstance(e, CmdOutputObservation) and e.cause == action.id
        )
        assert seq is not None
        return seq

    def checkpoint(self, action: CmdRunAction, skipped: str = "") -> None:
        """The runtime's checkpoint after the command (`skipped`: none, and why)."""
        seq = self.seq_of(action.id)
        self.feed(
            WorkspaceCheckpointObservation(
                task_id=self.state.task_id,
                source=EventSource.ENVIRONMENT,
                cause=action.id,
                action_seq=seq,
                checkpoint="" if skipped else f"{self.state.task_id}/{seq}",
                skipped=skipped,  # type: ignore[arg-type]
                files=1,
                bytes=2,
            )
        )


def new_task(task_id: str = TASK, **fields: Any) -> Live:
    state = TaskState(
        task_id=task_id,
        task="write and run squares.py",
        created_at=datetime(2026, 11, 24, 1, 0, tzinfo=UTC),
        max_iterations=fields.pop("max_iterations", 10),
        initial_max_iterations=10,
        max_budget_usd=2.0,
        initial_budget_usd=2.0,
        **fields,
    )
    live = Live(state)
    live.feed(MessageAction(task_id=task_id, source=EventSource.USER, content=state.task))
    return live
