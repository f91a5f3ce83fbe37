"""A task's State (seed 001): the snapshot the controller loads, changes and saves per event."""

from __future__ import annotations

from collections.abc import Container
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .egress_policy import EgressPolicy
from .events import (
    AgentState,
    PlanItem,
    RiskLevel,
    RunnableAction,
    SubTaskSpend,
    TaskPriority,
    utc_now,
)
from .subjects import EVENTS_STREAM

__all__ = [
    "PROCESSED_KEPT",
    "ActionScope",
    "Approval",
    "ApprovedBy",
    "Awaiting",
    "Outgoing",
    "TaskResult",
    "TaskState",
    "TaskUsage",
]

PROCESSED_KEPT = 256
# An outbox is needed again only when its input is redelivered: the controller died between
# saving the State and publishing, and the task waits on what was not sent, so few inputs come
# in between (a user message, a notice). Each outbox holds whole payloads (an observation, and
# the step request carrying it), so this bounds the State: about 0.5 MB with 32 for a task of
# 30 KB outputs, read and written on every turn.
_OUTBOXES_KEPT = 8


class Awaiting(StrEnum):
    """Which answer the task is waiting for; any other answer is stale and ignored."""

    NOTHING = "nothing"
    AGENT = "agent"
    SECURITY = "security"
    RUNTIME = "runtime"
    USER = "user"
    CONFIRMATION = "confirmation"
    DELEGATE = "delegate"


class ApprovedBy(StrEnum):
    """Who let a runnable action run."""

    SECURITY = "security"  # the security monitor's ALLOW verdict, no confirmation needed
    USER = "user"  # confirmation mode: the user confirmed it


class Approval(BaseModel):
    """The review that let the action the task awaits from the runtime run. The runtime runs an
    order only when the State awaits that very action and holds its approval."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action_id: str
    by: ApprovedBy
    answer_id: str = Field(description="The ALLOW verdict's or the user's confirmation's id.")


class ActionScope(BaseModel):
    """Where the action the task awaits may connect while it runs (issue 27, item 6): its
    verdict's network scope within the task's egress policy. Set with the verdict; the order
    that runs that action carries it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action_id: str
    network: EgressPolicy


class TaskResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    final_message: str = ""
    outputs: dict[str, Any] = Field(default_factory=dict)


class TaskUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    llm_calls: int = 0


class Outgoing(BaseModel):
    """One message the controller decided to publish; kept until the decision is acknowledged."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: str
    stream: str
    payload: str
    msg_id: str
    carried: bool = Field(
        default=False,
        description="A log entry of an older input's outbox, sent again by a later turn "
        "(TaskState.outbox_leaving): not part of that turn's own chain of log entries.",
    )


class TaskState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    version: int = 0
    task: str
    agent_state: AgentState = AgentState.LOADING
    reason: str = ""
    created_at: datetime = Field(default_factory=utc_now)
    updated_at: datetime = Field(default_factory=utc_now)
    finished_at: datetime | None = None

    iteration: int = 0
    max_iterations: int = Field(ge=1)
    initial_max_iterations: int | None = Field(
        default=None, description="Added to the limit each time a user message resumes the task."
    )
    max_budget_usd: float | None = Field(default=None, gt=0)
    initial_budget_usd: float | None = Field(default=None, gt=0)
    last_seq: int = 0
    unseen_events: list[dict[str, Any]] | None = Field(
        default_factory=list,
        description="Log entries appended since the last step request, for the next one to "
        "carry (the reasoner then reads no history from storage); None once they passed "
        "UNSEEN_MAX_BYTES, and the reasoner reads them from storage.",
    )
    unseen_bytes: int = Field(default=0, ge=0, description="Encoded size of unseen_events.")

    confirmation_mode: bool = False
    confirmation_threshold: RiskLevel = RiskLevel.HIGH
    network_egress: bool = Field(
        default=False, description="The task's sandbox may reach the network (none by default)."
    )
    network: EgressPolicy | None = Field(
        default=None,
        description="The task's egress policy: where its sandbox may connect, through the "
        "egress proxy only (chosen at creation, within the operator's bound); None: no network.",
    )
    workspace_mib: int | None = Field(
        default=None,
        ge=1,
        description="The task's /workspace quota in MiB (chosen at creation, within the "
        "operator's maximum); None: the runtime's default size.",
    )
    tenant_id: str | None = Field(
        default=None,
        description="The tenant the task belongs to (a sub-task: its root's); its seats are "
        "counted against the tenant's share (shared/admission.py).",
    )
    priority: TaskPriority = Field(
        default=TaskPriority.INTERACTIVE,
        description="Interactive tasks take their tenant's free seats before its batch ones.",
    )
    recent: list[str] = Field(
        default_factory=list, description="Signatures since the last user message (stuck check)."
    )
    plan: list[PlanItem] = Field(
        default_factory=list, description="The agent's plan, as its last task_tracker set it."
    )
    loop_hints: int = Field(
        default=0,
        ge=0,
        description="Loop hints the agent was given since the last user message (issue 29).",
    )
    delegation_depth: int = Field(
        default=0, ge=0, description="How deep a sub-task is: 0 for a task made through the API."
    )
    max_delegation_depth: int = Field(
        default=3, ge=0, description="The deepest sub-task this task's tree may create."
    )
    max_sub_tasks: int = Field(
        default=10, ge=0, description="Sub-tasks one task may delegate over its life."
    )
    sub_task_spend: dict[str, SubTaskSpend] = Field(
        default_factory=dict,
        description="Each sub-task's latest report of what it used (its own sub-tasks "
        "included): it counts toward this task's iterations and budget.",
    )
    parent_task_id: str | None = None
    parent_action_id: str | None = Field(
        default=None, description="The parent's AgentDelegateAction this sub-task answers."
    )
    sub_tasks: list[str] = Field(default_factory=list)

    awaiting: Awaiting = Awaiting.NOTHING
    awaiting_id: str | None = Field(
        default=None, description="Id of the step request or action whose answer is awaited."
    )
    awaiting_deadline: datetime | None = Field(
        default=None, description="When the awaited answer is overdue (agent, security, runtime)."
    )
    awaiting_attempt: int = Field(
        default=0, ge=0, description="Times the awaited answer was asked for again."
    )
    pending_action: RunnableAction | None = Field(
        default=None, description="The runnable action under review or running."
    )
    approval: Approval | None = Field(
        default=None, description="How the action sent to the runtime was approved."
    )
    action_scope: ActionScope | None = Field(
        default=None,
        description="Where the awaited action may connect while it runs, if its verdict "
        "narrowed the task's egress policy.",
    )
    requeue_if_queued: bool = Field(
        default=False,
        description="Rebuilt from the log after Redis lost its data, while the awaited action "
        "was on its way to the runtime: if the runtime answers that it queued it for a seat, "
        "that queue may be the one Redis lost, so the order is sent again (once).",
    )
    runtime_replica: str | None = Field(
        default=None,
        description="The runtime replica holding the task's sandbox, as its last observation "
        "said: the task's orders go to that replica's queue (None: to any replica's).",
    )
    checkpoint_seq: int | None = Field(
        default=None,
        description="The seq naming the workspace checkpoint the log last recorded "
        "(issue 28): the task's orders name it, so a sandbox lost with its machine is restored "
        "from it on any replica.",
    )
    checkpoint_task: str | None = Field(
        default=None,
        description="Whose checkpoint `checkpoint_seq` is, when it is not this task's own: a "
        "fork's parent, until the fork stores its own.",
    )
    checkpoint_due: int | None = Field(
        default=None,
        description="The seq of an upload logged whose checkpoint the log does not hold yet: "
        "the task's next action waits for it (the runtime takes it first).",
    )
    forked_from: str | None = Field(default=None, description="The task this one is a fork of.")
    rewound_at: int | None = Field(
        default=None,
        description="The seq of the task's last rewind: checkpoints of actions before it are "
        "out of its course.",
    )
    restore_first: bool = Field(
        default=False,
        description="Rewound: the next action's sandbox gets the files of `checkpoint_seq` "
        "back before it runs (until the runtime answers that action).",
    )
    forked_at: int | None = Field(
        default=None, description="The seq of the parent's log this fork starts from."
    )
    result: TaskResult | None = None
    usage: TaskUsage = Field(default_factory=TaskUsage)

    processed: list[str] = Field(default_factory=list, description="Recent input ids applied.")
    outboxes: dict[str, list[Outgoing]] = Field(
        default_factory=dict,
        description="What each recent input produced, to replay on redelivery.",
    )

    def iterations_used(self) -> int:
        """The task's own steps and those of its sub-tasks: what max_iterations bounds."""
        return self.iteration + sum(s.iterations for s in self.sub_task_spend.values())

    def total_usage(self) -> TaskUsage:
        """The task's own LLM use and its sub-tasks': what max_budget_usd bounds."""
        spent = self.sub_task_spend.values()
        u = self.usage
        return TaskUsage(
            prompt_tokens=u.prompt_tokens + sum(s.prompt_tokens for s in spent),
            completion_tokens=u.completion_tokens + sum(s.completion_tokens for s in spent),
            cost_usd=u.cost_usd + sum(s.cost_usd for s in spent),
            llm_calls=u.llm_calls + sum(s.llm_calls for s in spent),
        )

    def has_processed(self, input_id: str) -> bool:
        return input_id in self.processed

    def outbox_leaving(self, published: Container[str]) -> list[Outgoing]:
        """The log entries of the outboxes the next `record_input` drops, but for those of
        inputs in `published` (what the caller saw published): the next turn sends them again
        (a no-op in JetStream if they are there). Else an input whose first sending failed
        (the events stream electing a leader, or the controller killed after its save) and
        whose redelivery came after eight other inputs of its task would find its outbox
        gone, and the log would keep a gap for good: a NATS-cluster e2e lost the checkpoint
        logged while its agent thought so. Each entry is carried once: a carrying turn whose
        own sending fails is redelivered with its outbox, carried entries included."""
        leaving = list(self.outboxes)[: max(0, len(self.outboxes) + 1 - _OUTBOXES_KEPT)]
        return [
            m.model_copy(update={"carried": True})
            for input_id in leaving
            if input_id not in published
            for m in self.outboxes[input_id]
            if m.stream == EVENTS_STREAM and not m.carried
        ]

    def record_input(self, input_id: str, outbox: list[Outgoing]) -> dict[str, Any]:
        """Field updates that remember an applied input and what it produced."""
        processed = [*self.processed, input_id][-PROCESSED_KEPT:]
        outboxes = dict(self.outboxes)
        outboxes[input_id] = outbox
        for stale in list(outboxes)[:-_OUTBOXES_KEPT]:
            del outboxes[stale]
        return {"processed": processed, "outboxes": outboxes}
