"""Request and response bodies of /v1/tasks."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from shared.admission import QueuePlace
from shared.egress_policy import EgressPolicy
from shared.events import AgentState, EventAdapter, PlanItem, RiskLevel, TaskPriority
from shared.secrets_store import MAX_SECRETS_PER_TASK, SECRET_NAME_PATTERN
from shared.state import Awaiting, TaskState
from shared.workspace import RepositorySpec

from ..http.models import ApiRequest
from ..webhooks.models import WebhookSpec
from .egress import TaskNetwork

__all__ = [
    "LABEL_PATTERN",
    "MAX_LABELS",
    "AcceptedEvent",
    "ConfirmationRequest",
    "CreateTaskRequest",
    "Label",
    "MessageRequest",
    "SubTaskView",
    "TaskCreated",
    "TaskList",
    "TaskResultView",
    "TaskSummary",
    "TaskUsageView",
    "TaskView",
]

_MAX_TEXT = 200_000  # well under NATS' 1 MB payload limit once wrapped in an event
# Enough for a listing to show what each task is without carrying 200,000 characters of it.
_SUMMARY_TEXT = 1_000

MAX_LABELS = 16
# Letters, digits and a few separators, so that `team=payments` or `ticket:ABC-12` fit and a
# label is safe in a URL's query as it is.
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/=@+-]{0,127}$"
Label = Annotated[str, StringConstraints(pattern=LABEL_PATTERN)]
SecretName = Annotated[str, StringConstraints(pattern=SECRET_NAME_PATTERN)]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    return value


class CreateTaskRequest(ApiRequest):
    task: str = Field(min_length=1, max_length=_MAX_TEXT, description="What the agent should do.")
    max_iterations: int | None = Field(
        default=None, ge=1, le=1000, description="Iteration limit; the server default if absent."
    )
    max_budget_usd: float | None = Field(
        default=None, gt=0, le=10_000, description="LLM spend limit in USD; the server default."
    )
    confirmation_mode: bool | None = Field(
        default=None, description="Risky actions wait for POST .../confirmation; server default."
    )
    confirmation_threshold: RiskLevel | None = Field(
        default=None, description="Lowest risk that needs confirmation; the server default."
    )
    network_egress: bool = Field(
        default=False,
        description="Give the task's sandbox network access (it has none by default): all the "
        "operator allows the tenant, as its egress policy. The server refuses it with 403 when "
        "its operator allows no egress.",
    )
    network: TaskNetwork | None = Field(
        default=None,
        description="The task's egress policy: where its sandbox may connect, through the "
        "egress proxy only (`allow` rules and the operator's `presets`, together), within what "
        "the operator allows the tenant (422 naming the first rule outside it). Absent or "
        "empty: no network.",
    )
    workspace_mib: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="The task's /workspace quota in MiB: writing past it fails with 'No space "
        "left on device'. At most the operator's maximum (DECKHANDS_MAX_WORKSPACE_MIB, 422 "
        "above it); absent, the runtime's default size. A size other than the default starts "
        "the task's sandbox for it (a cold start rather than a warm one).",
    )
    priority: TaskPriority = Field(
        default=TaskPriority.INTERACTIVE,
        description="When every sandbox seat is taken: an `interactive` task (a person waits "
        "for it) takes its tenant's next free seat before the tenant's `batch` ones (an "
        "evaluation, a migration). Seats are shared between tenants by their weights, "
        "whatever the priority. Sub-tasks inherit it.",
    )
    trajectory: list[dict[str, Any]] | None = Field(
        default=None,
        description="Replay: the events of an earlier task (GET .../trajectory, its `events` or "
        "the whole object); the agent's recorded actions are replayed instead of asking the LLM.",
    )
    labels: list[Label] = Field(
        default_factory=list,
        max_length=MAX_LABELS,
        description="Up to 16 distinct labels (1-128 characters: letters, digits, `._:/=@+-`), "
        "to find the task with GET /v1/tasks?label=...",
    )
    repository: RepositorySpec | None = Field(
        default=None,
        description="A git repository checked out into /workspace (`.git` included) before the "
        "task's first action: `url` (https, http or git), `ref` (branch, tag or commit; the "
        "default branch if absent), `token_secret` (the tenant's secret holding an access "
        "token). A failed checkout ends the task in ERROR with the reason.",
    )
    secrets: list[SecretName] = Field(
        default_factory=list,
        max_length=MAX_SECRETS_PER_TASK,
        description="Names of the tenant's secrets (PUT /v1/secrets/{name}) the task's commands "
        "get as environment variables; their values never appear in its events.",
    )
    webhook: WebhookSpec | None = Field(
        default=None,
        description="Where to POST the task's terminal state (and, with on_waiting, when it waits "
        "for a person); the tenant's default (PUT /v1/webhook) when absent.",
    )

    _task_not_blank = field_validator("task")(_not_blank)

    @field_validator("labels")
    @classmethod
    def _labels_are_distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("labels must be distinct")
        return value

    @field_validator("trajectory", mode="before")
    @classmethod
    def _unwrap_export(cls, value: Any) -> Any:
        # Accept the export object as it is, so `GET .../trajectory` can be posted back.
        if isinstance(value, dict) and "events" in value:
            return value["events"]
        return value

    @field_validator("trajectory")
    @classmethod
    def _events_are_valid(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, event in enumerate(value or []):
            try:
                EventAdapter.validate_python(event)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise ValueError(
                    f"event {index} is not a valid event ({where}: {first['msg']})"
                ) from None
        return value


class MessageRequest(ApiRequest):
    content: str = Field(min_length=1, max_length=_MAX_TEXT)
    network: TaskNetwork | None = Field(
        default=None,
        description="More egress for the task, with this message: rules and presets added to "
        "its policy, within its bound (422 naming a rule outside it, or for a task created "
        "without network access); logged with the message, in force from the next action.",
    )

    _content_not_blank = field_validator("content")(_not_blank)


class ConfirmationRequest(ApiRequest):
    action_id: str = Field(
        min_length=1, max_length=128, description="Id of the action awaiting confirmation."
    )
    approve: bool


class TaskCreated(BaseModel):
    id: str
    state: AgentState


class AcceptedEvent(BaseModel):
    """An event the gateway queued for the controller; the controller decides what it does."""

    task_id: str
    event_id: str
    kind: str


class TaskUsageView(BaseModel):
    """The task's LLM use, its sub-tasks' included (each counted once it reports)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: float
    llm_calls: int


class TaskResultView(BaseModel):
    final_message: str
    outputs: dict[str, Any]


def _usage(state: TaskState) -> TaskUsageView:
    usage = state.total_usage()
    return TaskUsageView(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        cost_usd=usage.cost_usd,
        llm_calls=usage.llm_calls,
    )


def _result(state: TaskState) -> TaskResultView | None:
    if state.result is None:
        return None
    return TaskResultView(final_message=state.result.final_message, outputs=state.result.outputs)


def _summary(state: TaskState) -> dict[str, Any]:
    """The fields a task and a sub-task view share."""
    return {
        "id": state.task_id,
        "task": state.task,
        "state": state.agent_state,
        "reason": state.reason,
        # What max_iterations bounds: the task's own steps and its sub-tasks'.
        "iterations": state.iterations_used(),
        "max_iterations": state.max_iterations,
        "usage": _usage(state),
        "result": _result(state),
    }


class SubTaskView(BaseModel):
    id: str
    task: str
    state: AgentState
    reason: str
    iterations: int
    max_iterations: int
    usage: TaskUsageView
    result: TaskResultView | None

    @classmethod
    def from_state(cls, state: TaskState) -> SubTaskView:
        return cls(**_summary(state))


class TaskView(BaseModel):
    id: str
    task: str
    state: AgentState
    reason: str
    iterations: int
    max_iterations: int
    max_budget_usd: float | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    usage: TaskUsageView
    result: TaskResultView | None = Field(description="Present once the task has finished.")
    confirmation_mode: bool
    confirmation_threshold: RiskLevel
    network_egress: bool = Field(
        description="Whether the task's sandbox is on the plain network of a server without an "
        "egress bound (DECKHANDS_ALLOW_NETWORK_EGRESS)."
    )
    network: EgressPolicy | None = Field(
        default=None, description="The task's egress policy; null: none (no network)."
    )
    workspace_mib: int | None = Field(
        default=None, description="The task's /workspace quota in MiB; null: the default."
    )
    awaiting: Awaiting = Field(description="Which answer the task is waiting for.")
    pending_action: dict[str, Any] | None = Field(
        description="The runnable action under review, running, or awaiting confirmation "
        "(its `id` is the `action_id` to confirm)."
    )
    parent_task_id: str | None
    sub_tasks: list[SubTaskView] = Field(description="Tasks this one delegated, oldest first.")
    priority: TaskPriority = Field(
        default=TaskPriority.INTERACTIVE, description="interactive or batch (see POST)."
    )
    queue_position: int | None = Field(
        default=None,
        description="While the task waits for a sandbox (every seat of the pool is taken): "
        "how many tasks take a seat before it, plus one (1 is next), in the fair order: seats "
        "go to the tenant furthest below its weighted share, interactive before batch within "
        "a tenant. It counts as if every tenant kept the seats it holds.",
    )
    queue_estimate_s: float | None = Field(
        default=None,
        description="While queued: the seconds until that many seats free, at the rate seats "
        "freed in the last 10 minutes; null when too few freed to tell.",
    )
    labels: list[str] = Field(default_factory=list, description="Set at creation.")
    forked_from: str | None = Field(default=None, description="The task this is a fork of.")
    forked_at: int | None = Field(default=None, description="The seq of its parent it forked at.")
    plan: list[PlanItem] = Field(default_factory=list, description="The agent's plan, if any.")

    @classmethod
    def from_state(
        cls,
        state: TaskState,
        sub_tasks: list[TaskState] | None = None,
        place: QueuePlace | None = None,
        labels: tuple[str, ...] = (),
    ) -> TaskView:
        pending = state.pending_action
        return cls(
            priority=state.priority,
            queue_position=None if place is None else place.position,
            queue_estimate_s=None if place is None else place.estimate_s,
            labels=list(labels),
            **_summary(state),
            max_budget_usd=state.max_budget_usd,
            created_at=state.created_at,
            updated_at=state.updated_at,
            finished_at=state.finished_at,
            confirmation_mode=state.confirmation_mode,
            confirmation_threshold=state.confirmation_threshold,
            network_egress=state.network_egress,
            network=state.network,
            workspace_mib=state.workspace_mib,
            awaiting=state.awaiting,
            pending_action=None if pending is None else pending.model_dump(mode="json"),
            parent_task_id=state.parent_task_id,
            forked_from=state.forked_from,
            forked_at=state.forked_at,
            plan=list(state.plan),
            sub_tasks=[SubTaskView.from_state(sub) for sub in sub_tasks or []],
        )


class TaskSummary(BaseModel):
    """A task as a listing shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    task: str = Field(description=f"The task's text, its first {_SUMMARY_TEXT} characters.")
    state: AgentState
    reason: str
    labels: list[str]
    iterations: int
    cost_usd: float = Field(
        description="The task's LLM spend so far, its sub-tasks' included once they report."
    )
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    forked_from: str | None = None
    forked_at: int | None = None

    @classmethod
    def of(cls, state: TaskState, labels: tuple[str, ...]) -> TaskSummary:
        return cls(
            id=state.task_id,
            task=state.task[:_SUMMARY_TEXT],
            state=state.agent_state,
            reason=state.reason,
            labels=list(labels),
            iterations=state.iteration,
            cost_usd=state.total_usage().cost_usd,
            created_at=state.created_at,
            updated_at=state.updated_at,
            finished_at=state.finished_at,
            forked_from=state.forked_from,
            forked_at=state.forked_at,
        )


class TaskList(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tasks: list[TaskSummary] = Field(description="Newest first.")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null: there is none. A page may hold "
        "fewer tasks than `limit` while this is set (filters look at a bounded number of tasks "
        "per request)."
    )
