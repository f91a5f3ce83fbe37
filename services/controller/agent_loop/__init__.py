"""What the controller does with each input event (seed 001's step loop, one event at a time).

`apply(turn, event)` is pure: it reads the State in `turn`, and records what to log, what
to send and how the State changes. Nothing here touches Redis or NATS. One module per source
of input (from_user, from_agent, from_security, from_runtime, delegation for sub-tasks,
missing_answers for deadlines); where a task goes next is decided in next_hop alone.
"""

from __future__ import annotations

from shared.events import (
    AgentDelegateObservation,
    AnswerMissingObservation,
    EgressActivityObservation,
    EventBase,
    EventSource,
    ReviewedAction,
    RewindAction,
    SandboxQueuedObservation,
    TaskCreatedObservation,
    WorkspaceCheckpointObservation,
    WorkspaceUploadedObservation,
)
from shared.state import Awaiting
from shared.task_creation import created_entry

from ..metrics import STALE
from ..turn import Turn
from .common import CONTROLLER_ERROR_CODES, count, log
from .delegation import answers_delegation, count_sub_task_spend, sub_task_id
from .from_agent import from_agent, is_rate_limit_notice, rate_limited, reviewed
from .from_runtime import is_order_refusal, observed, queued, send_queued_action
from .from_security import from_security
from .from_user import from_user
from .missing_answers import answer_missing, ask_for_lost_step
from .rewind import rewind
from .workspace_changes import checkpointed, uploaded

__all__ = [
    "CONTROLLER_ERROR_CODES",
    "apply",
    "ask_for_lost_step",
    "created_entry",
    "rewind",
    "send_queued_action",
    "sub_task_id",
]


def apply(turn: Turn, event: EventBase) -> None:
    if turn.state.last_seq == 0:
        # The task's first turn: its log opens with what the task was created with, so that
        # the log alone can rebuild its State (services/controller/rebuild.py).
        turn.log(created_entry(turn.state))
    awaiting, awaiting_id = turn.state.awaiting, turn.state.awaiting_id
    if isinstance(event, TaskCreatedObservation):
        # A request to make a task that exists (the gateway sent it again after a lost
        # acknowledgement): the task was made from its first copy.
        count(turn, STALE.labels(event.kind))
    elif isinstance(event, EgressActivityObservation):
        # The egress proxy's account of the sandbox's connections: a fact for the log, which
        # changes nothing of the task's course (it comes between any two steps).
        turn.log(event)
    elif isinstance(event, WorkspaceCheckpointObservation):
        checkpointed(turn, event)
    elif isinstance(event, WorkspaceUploadedObservation):
        uploaded(turn, event)
    elif isinstance(event, ReviewedAction):
        reviewed(turn, event)
    elif isinstance(event, RewindAction):
        # Rewinds need the task's log: the controller's handler (and a rebuild) give the point
        # to rewind() itself; one that reaches here has none.
        rewind(turn, event, None, "the task's log was not read")
    elif event.source is EventSource.USER:
        from_user(turn, event)
    elif isinstance(event, AgentDelegateObservation) and not answers_delegation(turn.state, event):
        # A sub-task reporting after its parent stopped waiting (the parent was stopped, or
        # the sub-task ended after asking a question): not part of the log, but what it spent
        # is still the parent's (and so the root's).
        count_sub_task_spend(turn, event)
        count(turn, STALE.labels(event.kind))
    elif (
        event.cause is None
        or event.cause != awaiting_id
        or (is_order_refusal(event) and awaiting is not Awaiting.RUNTIME)
    ):
        # A late answer (the task was stopped meanwhile) or a duplicate: not part of the log.
        # So is the runtime's refusal of an order the task did not send it (forged while the
        # action was still under review or awaiting confirmation).
        count(turn, STALE.labels(getattr(event, "kind", "?")))
        log.info("task %s: ignoring stale %s %s", event.task_id, type(event).__name__, event.id)
    elif isinstance(event, AnswerMissingObservation):
        answer_missing(turn, event)
    elif isinstance(event, SandboxQueuedObservation):
        queued(turn, event)
    elif awaiting is Awaiting.AGENT and is_rate_limit_notice(event):
        rate_limited(turn, event)
    elif awaiting is Awaiting.AGENT:
        from_agent(turn, event)
    elif awaiting is Awaiting.SECURITY:
        from_security(turn, event)
    elif awaiting in (Awaiting.RUNTIME, Awaiting.DELEGATE):
        observed(turn, event)
    else:
        count(turn, STALE.labels(getattr(event, "kind", "?")))
