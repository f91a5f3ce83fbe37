"""Observations: what happened in answer to an action (seeds 001 and 004)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..egress_policy import EgressPolicy
from .actions import LLMUsage
from .base import BlobRef, EventBase
from .state import AgentState, TaskPriority

__all__ = [
    "AgentDelegateObservation",
    "AgentStateChangedObservation",
    "AnswerMissingObservation",
    "CmdOutputObservation",
    "ErrorObservation",
    "FileEditObservation",
    "FileReadObservation",
    "FileWriteObservation",
    "LoopHintObservation",
    "MCPCallObservation",
    "PythonOutputObservation",
    "RiskLevel",
    "RuntimeAnswer",
    "SandboxQueuedObservation",
    "SecurityVerdictObservation",
    "SubTaskSpend",
    "TaskCreatedObservation",
    "UserRejectObservation",
    "Verdict",
]


class _RuntimeAnswer(EventBase):
    """An observation the runtime may answer with: it names the runtime replica holding the
    task's sandbox, so that the controller sends the task's next order there."""

    runtime_replica: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="The runtime replica whose engine holds the task's sandbox after this "
        "action; None: none holds it, or not known (the next order goes to any replica).",
    )


RuntimeAnswer = _RuntimeAnswer  # the kinds that answer an action the runtime ran


class CmdOutputObservation(_RuntimeAnswer):
    kind: Literal["run_output"] = "run_output"
    command: str
    content: str
    exit_code: int
    cwd: str
    timed_out: bool = False
    content_ref: BlobRef | None = Field(
        default=None,
        description="The whole output, kept in the blob store when `content` had to be cut.",
    )


class PythonOutputObservation(_RuntimeAnswer):
    kind: Literal["python_output"] = "python_output"
    content: str
    exit_code: int = 0
    content_ref: BlobRef | None = Field(
        default=None,
        description="The whole output, kept in the blob store when `content` had to be cut.",
    )


class FileReadObservation(_RuntimeAnswer):
    kind: Literal["read_output"] = "read_output"
    path: str
    content: str
    content_ref: BlobRef | None = Field(
        default=None,
        description="The whole text read, kept in the blob store when `content` had to be cut.",
    )


class FileWriteObservation(_RuntimeAnswer):
    kind: Literal["write_output"] = "write_output"
    path: str
    content: str = ""


class FileEditObservation(_RuntimeAnswer):
    kind: Literal["edit_output"] = "edit_output"
    path: str
    content: str = Field(description="What was done, or the viewed text with line numbers.")
    diff: str = Field(default="", description="Unified diff of the edit; empty for view.")


class MCPCallObservation(_RuntimeAnswer):
    """What an MCP tool answered (its text content), or the error it reported."""

    kind: Literal["mcp_output"] = "mcp_output"
    server: str
    tool: str
    content: str
    is_error: bool = Field(default=False, description="The tool reported an error.")


class ErrorObservation(_RuntimeAnswer):
    """Something went wrong that the agent should see and can react to."""

    kind: Literal["error"] = "error"
    content: str
    error_code: str = Field(default="error", description="Machine-readable class of the error.")
    llm_usage: LLMUsage | None = Field(
        default=None, description="Set when a bad LLM reply cost tokens; counts toward the budget."
    )


class AgentStateChangedObservation(EventBase):
    kind: Literal["agent_state_changed"] = "agent_state_changed"
    agent_state: AgentState
    previous_state: AgentState | None = None
    reason: str = ""


class RiskLevel(StrEnum):
    LOW = "LOW"
    MEDIUM = "MEDIUM"
    HIGH = "HIGH"
    UNKNOWN = "UNKNOWN"


class Verdict(StrEnum):
    ALLOW = "ALLOW"
    DENY = "DENY"


class SecurityVerdictObservation(EventBase):
    """The security monitor's ruling on one runnable action (its `cause`)."""

    kind: Literal["security_verdict"] = "security_verdict"
    verdict: Verdict
    risk: RiskLevel
    rule: str | None = Field(default=None, description="The rule that matched, if any.")
    reason: str = ""
    network_scope: tuple[str, ...] | None = Field(
        default=None,
        max_length=64,
        description="Where the action needs to connect (egress rules: the index `pip install` "
        "uses, the host `git clone` fetches from...); while it runs, a task with an egress "
        "policy reaches only those of them its policy allows. Empty: nowhere. None: the "
        "command could not be placed, and the task's whole policy applies.",
    )


class UserRejectObservation(EventBase):
    """The user refused to let the action (its `cause`) run."""

    kind: Literal["user_rejected"] = "user_rejected"
    content: str = "The user rejected this action."


class SubTaskSpend(BaseModel):
    """What a sub-task (with its own sub-tasks) used so far: it comes out of its parent's
    iterations and budget."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    iterations: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)
    llm_calls: int = Field(default=0, ge=0)


class AgentDelegateObservation(EventBase):
    """A sub-task ended; carries its outcome back to the parent's delegate action (`cause`)."""

    kind: Literal["delegate_output"] = "delegate_output"
    sub_task_id: str
    agent_state: AgentState
    content: str = ""
    outputs: dict[str, Any] = Field(default_factory=dict)
    spent: SubTaskSpend | None = Field(
        default=None,
        description="The sub-task's use so far (cumulative): the parent counts the latest report "
        "of each sub-task toward its own iterations and budget.",
    )


class AnswerMissingObservation(EventBase):
    """The answer a task waits for (`cause`: the step request or action id) is not coming.

    Sent to the controller, never to the agent: by the controller's deadline sweeper when the
    answer is overdue (`why="overdue"`: the controller asks again, then gives up), or by the
    service that dead-lettered the order (`why="dead_lettered"`: the task ends in ERROR with
    the reason). The controller logs only the state change it causes.
    """

    kind: Literal["answer_missing"] = "answer_missing"
    why: Literal["overdue", "dead_lettered"]
    awaiting: str = Field(description="Which service's answer: agent, security or runtime.")
    attempt: int = Field(default=0, ge=0, description="Re-requests already made.")
    detail: str = Field(default="", max_length=2000, description="What the sender knows.")


class SandboxQueuedObservation(EventBase):
    """The action (`cause`) waits for a sandbox: every seat of the pool is taken.

    Sent by the runtime when it queues the task (first come, first served); the action runs as
    soon as a seat frees, without being sent again. Logged, so the user sees the task's place;
    `GET /v1/tasks/{id}` shows the live one. The controller then waits up to its queue deadline.
    """

    kind: Literal["sandbox_queued"] = "sandbox_queued"
    position: int = Field(ge=1, description="Place in the queue when queued (1 = next).")
    max_sandboxes: int = Field(ge=1, description="Seats of the pool (tasks holding a sandbox).")


class LoopHintObservation(EventBase):
    """The controller's word to the agent when its recent steps repeat (issue 29): what
    repeats and a way out. The agent goes on; a loop that persists past the hints ends the
    task in ERROR with the pattern as its reason."""

    kind: Literal["loop_hint"] = "loop_hint"
    pattern: str = Field(max_length=500, description="What repeats, as the detector named it.")
    hint: str = Field(max_length=4000, description="The text the agent reads in its prompt.")
    hints_given: int = Field(ge=1, description="Hints given since the last user message.")


class TaskCreatedObservation(EventBase):
    """The limits and settings a task was created with: the first entry of every task's log,
    written by the controller when it makes the task's State.

    The gateway asks the controller to make a task by sending it this entry with the task's
    text (`task`, shared/task_creation.py); a delegating parent makes its sub-task itself. The
    log is the source of truth: with this entry, the task's State can be rebuilt from its log
    alone when Redis lost it (services/controller/rebuild.py). The log's copy leaves the text
    out: it is the first user message, the entry after this one.
    """

    kind: Literal["task_created"] = "task_created"
    created_at: datetime
    max_iterations: int = Field(ge=1)
    initial_max_iterations: int | None = None
    max_budget_usd: float | None = Field(default=None, gt=0)
    initial_budget_usd: float | None = Field(default=None, gt=0)
    confirmation_mode: bool = False
    confirmation_threshold: RiskLevel = RiskLevel.HIGH
    network_egress: bool = False
    network: EgressPolicy | None = Field(
        default=None, description="The task's egress policy; None: no network."
    )
    workspace_mib: int | None = Field(default=None, ge=1)
    tenant_id: str | None = Field(
        default=None, description="The tenant the task (a sub-task: its root) belongs to."
    )
    priority: TaskPriority = TaskPriority.INTERACTIVE
    delegation_depth: int = Field(default=0, ge=0)
    max_delegation_depth: int = Field(default=3, ge=0)
    max_sub_tasks: int = Field(default=10, ge=0)
    parent_task_id: str | None = None
    parent_action_id: str | None = None
    forked_from: str | None = Field(
        default=None, description="The task this one is a fork of (issue 28)."
    )
    forked_at: int | None = Field(
        default=None, ge=1, description="The seq of the parent's log the fork starts from."
    )
    fork_checkpoint: str | None = Field(
        default=None,
        max_length=200,
        description="The checkpoint a fork's /workspace starts from ('<task>/<seq>'); None: "
        "an empty one (no action had changed files by `forked_at`).",
    )
    task: str | None = Field(
        default=None,
        description="The task's text, in the gateway's request to make the task; left out of "
        "the log (the first user message holds it).",
    )
