"""The runtime's answers: an action's observation, a sub-task's report, or an action queued for
a sandbox seat."""

from __future__ import annotations

from shared.commands import ORDER_REFUSED
from shared.events import (
    AgentDelegateObservation,
    ErrorObservation,
    EventBase,
    SandboxQueuedObservation,
)
from shared.state import Awaiting
from shared.subjects import Service

from ..metrics import QUEUED, STALE
from ..turn import Turn
from .common import count, log, remember
from .delegation import count_sub_task_spend
from .next_hop import execute_order, next_step

__all__ = [
    "is_order_refusal",
    "observed",
    "queued",
    "send_queued_action",
]


def is_order_refusal(event: EventBase) -> bool:
    return isinstance(event, ErrorObservation) and event.error_code == ORDER_REFUSED


def observed(turn: Turn, event: EventBase) -> None:
    if turn.state.awaiting is Awaiting.RUNTIME:
        # The runtime's answer names the replica whose engine holds the task's sandbox (or
        # none): the task's next orders go to that replica (Turn.outbox).
        turn.update(runtime_replica=getattr(event, "runtime_replica", None))
        if not is_order_refusal(event):
            turn.update(restore_first=False)  # a rewound task's files are back
    logged = turn.log(event)
    if not getattr(turn.state.pending_action, "on_agents_behalf", False):
        remember(turn, logged)  # what the system ran for the agent is no step of its own
    if isinstance(event, AgentDelegateObservation):
        count_sub_task_spend(turn, event)
        log.info(
            "task %s: sub-task %s ended %s", event.task_id, event.sub_task_id, event.agent_state
        )
    turn.update(
        awaiting=Awaiting.NOTHING,
        awaiting_id=None,
        pending_action=None,
        approval=None,
        requeue_if_queued=False,
    )
    next_step(turn)


def queued(turn: Turn, event: SandboxQueuedObservation) -> None:
    """The action waits for a seat: logged for the user; the runtime runs it once seated.
    After a rebuild, the queue it names may be the one Redis lost (the runtime queued it just
    before the loss): the order is sent again, once (the same action: it runs at most once, and
    queueing it again where it is queued keeps its place)."""
    if turn.state.awaiting is not Awaiting.RUNTIME:
        count(turn, STALE.labels(event.kind))
        return
    turn.log(event)
    count(turn, QUEUED)
    if turn.state.requeue_if_queued:
        turn.update(requeue_if_queued=False)
        send_queued_action(turn)


def send_queued_action(turn: Turn) -> None:
    """A rebuilt State whose action waited for a sandbox seat: the runtime kept that order in
    Redis, which lost it, so it is sent again (same action id: it still runs at most once)."""
    action = turn.state.pending_action
    if turn.state.awaiting is Awaiting.RUNTIME and action is not None:
        turn.send(Service.RUNTIME, execute_order(turn.state, action))
