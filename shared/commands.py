"""Work orders between services. They are not events: they are not logged, they ask for work.

The events they carry (an action to review or run) are logged by the controller before routing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .egress_policy import EgressPolicy
from .events import RunnableAction, TaskPriority, new_id

# Every name here is a command model (a test checks the schema has each); MAX_SEQ and
# ORDER_REFUSED are imported by name.
__all__ = [
    "CheckpointWorkspace",
    "ExecuteAction",
    "ForgetTaskReply",
    "ForgetTaskRequest",
    "HistoryReply",
    "HistoryRequest",
    "PrepareSandbox",
    "ReleaseSandbox",
    "ReviewAction",
    "StepRequest",
]


# Seqs are SQLite INTEGERs (signed 64-bit); a cursor beyond is refused, not sent to storage.
MAX_SEQ = 2**63 - 1


class _Command(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=new_id, description="Unique id; also the Nats-Msg-Id.")
    task_id: str


class StepRequest(_Command):
    """Controller → reasoner: decide the next action given the log up to `after_seq`."""

    kind: Literal["step_request"] = "step_request"
    after_seq: int = Field(description="The reasoner must see the log at least up to this seq.")
    iteration: int
    tenant_id: str | None = Field(
        default=None, description="The task's tenant: whose share of the LLM's capacity it uses."
    )
    priority: TaskPriority = Field(
        default=TaskPriority.INTERACTIVE,
        description="Its place among its tenant's waiting LLM calls (interactive before batch).",
    )
    review_runnable: bool = Field(
        default=True,
        description="Where the reasoner sends a runnable answer (a command, an edit): true, to "
        "the security monitor, which passes it on to the controller with its verdict; false, "
        "to the controller. The controller's policy chooses every hop; the reasoner follows.",
    )
    events: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The log entries appended since the previous step request, up to "
        "after_seq, when they are small (the controller's UNSEEN_MAX_BYTES): a reasoner that "
        "has the log up to the first of them needs no storage read. Empty: read storage.",
    )


class ReviewAction(_Command):
    """Controller → security monitor: rule on this action before it may run."""

    kind: Literal["review_action"] = "review_action"
    action: RunnableAction


class ExecuteAction(_Command):
    """Controller → runtime: run this approved action in the task's sandbox."""

    kind: Literal["execute_action"] = "execute_action"
    action: RunnableAction
    network_egress: bool = Field(
        default=False,
        description="The task opted in to network egress: its sandbox joins a network.",
    )
    network_scope: EgressPolicy | None = Field(
        default=None,
        description="Where the sandbox may connect while this action runs: its verdict's "
        "network scope within `network` (issue 27, item 6); None: all of `network`.",
    )
    network: EgressPolicy | None = Field(
        default=None,
        description="The task's egress policy: where its sandbox may connect, through the "
        "egress proxy only; None: no network. The runtime refuses an order whose policy is not "
        "the task's.",
    )
    workspace_mib: int | None = Field(
        default=None,
        ge=1,
        description="The task's /workspace quota in MiB (chosen at creation, within the "
        "operator's maximum); None: the runtime's default size.",
    )
    tenant_id: str | None = Field(
        default=None, description="The task's tenant: whose share of the seats it takes."
    )
    priority: TaskPriority = Field(
        default=TaskPriority.INTERACTIVE,
        description="Its place among its tenant's queued tasks (interactive before batch).",
    )
    checkpoint_seq: int | None = Field(
        default=None,
        description="The task's last workspace checkpoint in its log (the seq of its action): "
        "a new checkpoint adds to it (issue 28).",
    )
    checkpoint_task: str | None = Field(
        default=None,
        description="Whose checkpoint that is, when not this task's own (a fork's parent): a "
        "fork's first sandbox starts from it.",
    )
    restore_first: bool = Field(
        default=False,
        description="The task was rewound: its /workspace goes back to that checkpoint (what "
        "is not in it removed) before the action runs.",
    )
    checkpoint_due: int | None = Field(
        default=None,
        description="The seq of an upload logged before this action whose checkpoint the log "
        "does not hold yet: the runtime takes it before the action runs, if it has not (its "
        "CheckpointWorkspace may come after this order).",
    )


# The error_code of the ErrorObservation answering an ExecuteAction the runtime refused to run:
# not the action the task's State awaits, not approved, or the task stopped or paused.
ORDER_REFUSED = "order_refused"


class PrepareSandbox(_Command):
    """Controller → runtime, with a task's first step: get the task's sandbox ready (a seat, a
    warm or new container bound to the task) while the agent thinks, so the first action does
    not wait for a cold start. Best effort: the first action gets one anyway."""

    kind: Literal["prepare_sandbox"] = "prepare_sandbox"
    network_egress: bool = Field(
        default=False,
        description="The task opted in to network egress: its sandbox joins a network.",
    )
    network: EgressPolicy | None = Field(
        default=None,
        description="The task's egress policy: where its sandbox may connect, through the "
        "egress proxy only; None: no network. The runtime refuses an order whose policy is not "
        "the task's.",
    )
    workspace_mib: int | None = Field(
        default=None,
        ge=1,
        description="The task's /workspace quota in MiB (chosen at creation, within the "
        "operator's maximum); None: the runtime's default size.",
    )
    tenant_id: str | None = Field(
        default=None, description="The task's tenant: whose share of the seats it takes."
    )
    priority: TaskPriority = Field(
        default=TaskPriority.INTERACTIVE,
        description="Its place among its tenant's queued tasks (interactive before batch).",
    )


class CheckpointWorkspace(_Command):
    """Controller → runtime: the task's /workspace changed outside its actions (an upload,
    logged at `seq`): take the checkpoint of its files there (issue 28)."""

    kind: Literal["checkpoint_workspace"] = "checkpoint_workspace"
    seq: int = Field(ge=1, description="The seq of the entry that logged the change.")
    cause: str = Field(description="That entry's id.")
    tenant_id: str | None = Field(default=None, description="The task's tenant (its quota).")
    checkpoint_seq: int | None = Field(
        default=None, description="The task's last checkpoint in its log (as ExecuteAction's)."
    )
    checkpoint_task: str | None = Field(
        default=None, description="Whose checkpoint that is (as ExecuteAction's)."
    )


class ReleaseSandbox(_Command):
    """Controller → runtime: the task has ended; destroy its sandbox."""

    kind: Literal["release_sandbox"] = "release_sandbox"
    reason: str = ""


class HistoryRequest(BaseModel):
    """Gateway or reasoner → storage (request/reply): a task's events with seq > after."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    after: int = Field(default=0, ge=0, le=MAX_SEQ)
    limit: int = Field(default=1000, ge=1, le=10000)
    max_bytes: int = Field(
        default=512 * 1024,
        ge=1024,
        description="About how many bytes of events the reply may carry (at least one event "
        "is always sent); storage also keeps every reply below NATS' max_payload.",
    )


class HistoryReply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    events: list[dict[str, object]]
    error: str | None = Field(
        default=None,
        description="Why storage could not serve the request (a malformed one, or its own "
        "failure); events is then empty. Every request gets a reply.",
    )
    last_seq: int = Field(
        description="Highest seq stored for the task, 0 if none; when the events stop before a "
        "seq that is still being stored, the seq before it (so a reader knows to ask again later)."
    )


class ForgetTaskRequest(BaseModel):
    """Gateway → every storage replica (request/reply, no queue group): remove the task's
    stored events, for DELETE /v1/tasks/{id}. The first replica's reply answers the request."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str


class ForgetTaskReply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    removed: int = Field(default=0, description="Events this replica removed.")
    error: str | None = Field(default=None, description="Why the replica could not remove them.")
