"""A fork's first turn (issue 28, item 2): the parent's log up to the fork point copied into the
fork's, the State rebuilt there, and the task sent on its way.

The gateway checked the fork (the parent is the tenant's, the point is in its log, its files
were kept) and sent the fork's creation request on the fork's own work subject, naming the
parent, the point and the checkpoint its /workspace starts from. The controller reads the
parent's log straight from JetStream (services/controller/task_log.py) and makes the fork in
one turn, saved and published like any other: its log opens with its own creation entry, then
the parent's entries 2..N, each keeping its seq and time, marked `inherited_from`, under ids
of the fork's own (derived from the parent's, causes too), so the fork's log reads as the
parent's did and stays whole if the parent is deleted. The fork's
own message (if any) follows, and the next hop is what the rebuilt State awaits.

A fork point is never inside a turn, nor on an action in flight (rebuild.rebuild_at).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.commands import StepRequest
from shared.events import AgentState, EventBase, EventSource, MessageAction, TaskCreatedObservation
from shared.state import Awaiting, TaskState
from shared.subjects import Service
from shared.task_creation import created_entry, derived_event_id, state_from_created

from .agent_loop import apply, ask_for_lost_step
from .agent_loop.next_hop import prepare_order, request_step
from .errors import RebuildError
from .rebuild import rebuild_at
from .turn import Turn

__all__ = ["fork_turn"]


def fork_turn(
    created: TaskCreatedObservation, parent_log: Sequence[EventBase], answer_retries: int
) -> Turn:
    """The fork's first turn, from its creation request and its parent's whole log."""
    parent, at = created.forked_from, created.forked_at
    if parent is None or at is None:
        raise RebuildError(f"task {created.task_id}: not a fork")
    fork = created.task_id
    own = created_entry(state_from_created(created)).model_copy(update={"seq": 1})
    copies = [
        _copy(e, fork, parent)
        for e in parent_log
        if e.seq is not None and e.seq > 1 and not isinstance(e, TaskCreatedObservation)
    ]
    if not copies:
        raise RebuildError(f"task {created.task_id}: task {parent}'s log is empty")
    rebuilt, end = rebuild_at([own, *copies], at)
    turn = Turn(_as_fork(rebuilt, created), answer_retries=answer_retries)
    turn.inherit([own, *(e for e in copies if e.seq is not None and e.seq <= end)])
    if created.task:
        apply(
            turn,
            MessageAction(
                id=derived_event_id(fork, "fork-message"),
                task_id=fork,
                source=EventSource.USER,
                timestamp=created.timestamp,
                content=created.task,
            ),
        )
    _go_on(turn)
    if any(isinstance(m, StepRequest) for _, m in turn.sent):
        # A fork's first sandbox starts (and gets its files) while the agent thinks.
        turn.send(Service.RUNTIME, prepare_order(turn.state))
    return turn


def _copy(entry: EventBase, fork: str, parent: str) -> EventBase:
    """The parent's entry in the fork's log: the same entry at the same seq and time, under an
    id of the fork's own (an event id names one entry of one log: storage and JetStream's
    deduplication hold to it), derived from the parent's, and so are the ids it answers."""
    return entry.model_copy(
        update={
            "id": derived_event_id(fork, entry.id),
            "cause": None if entry.cause is None else derived_event_id(fork, entry.cause),
            "task_id": fork,
            "inherited_from": entry.inherited_from or parent,
        }
    )


def _as_fork(rebuilt: TaskState, created: TaskCreatedObservation) -> TaskState:
    """The rebuilt State as the fork's own: its files are the checkpoint the gateway named
    (one logged after the point is not in the copied log), its sub-tasks are the parent's
    (it has none of its own), and its orders go to any runtime replica (the parent's sandbox
    is not its)."""
    made = state_from_created(created)
    return rebuilt.model_copy(
        update={
            "checkpoint_task": made.checkpoint_task,
            "checkpoint_seq": made.checkpoint_seq,
            "checkpoint_due": None,  # the checkpoint the gateway named holds the files
            "sub_tasks": [],
            "runtime_replica": None,
            "requeue_if_queued": False,
        }
    )


def _go_on(turn: Turn) -> None:
    """The fork continues: the agent is asked for its next step if the State awaits one (the
    request that was in flight for the parent is not the fork's); a task that awaits a person
    (a question, a confirmation) or has ended waits for a message, as the parent did."""
    s = turn.state
    if s.awaiting is Awaiting.AGENT and s.awaiting_id is None:
        ask_for_lost_step(turn)
    elif s.awaiting is Awaiting.NOTHING and s.agent_state is AgentState.RUNNING:
        request_step(turn)
