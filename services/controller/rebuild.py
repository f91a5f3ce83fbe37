"""A task's State rebuilt from its event log, for when Redis lost it (issue 12, part 2).

The log is the source of truth and Redis only a snapshot of it. Every log opens with the task's
TaskCreatedObservation (its limits and settings); after it, each turn of the controller logged
its input (a user message, the agent's action, a verdict, an observation...) followed by what
the turn itself wrote (state changes, refusals), in consecutive seqs. `rebuild_state` replays
each logged input through the live policy (`apply`), so the rebuilt State is what the same
code decided, not a second copy of the rules; the entries the replay writes are checked against
the ones in the log, and where they differ (an input that is not logged, such as an overdue
notice that ended the task) the log's entries win.

What the log cannot tell, and what a rebuilt State holds instead:
- the id of a step request in flight (requests are not logged): the cause of `next_input` when
  it is the answer to an unknown request (the input that made the controller rebuild), else
  None, and the controller asks for the step again (`agent_loop.ask_for_lost_step`);
- `awaiting_attempt` (re-requests are not logged): 0, and `awaiting_deadline`: None, for the
  caller to set;
- `unseen_events`: None, so the next step's reasoner reads the history from storage;
- `processed`: the ids of the logged inputs; `outboxes`: none;
- `sub_task_spend`: each sub-task's latest report in the log; a report that came after the task
  stopped waiting for that sub-task was never logged;
- `version`: 0 (the caller creates it); `updated_at`: the last entry's time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from shared.events import (
    AgentState,
    AgentStateChangedObservation,
    ErrorObservation,
    EventBase,
    EventSource,
    LoopHintObservation,
    MessageAction,
    RewindAction,
    SandboxQueuedObservation,
    TaskCreatedObservation,
    UserRejectObservation,
)
from shared.state import PROCESSED_KEPT, Awaiting, TaskState
from shared.task_creation import state_from_created

from .agent_loop import CONTROLLER_ERROR_CODES, apply, rewind
from .errors import RebuildError
from .turn import Turn

__all__ = ["is_logged_input", "rebuild_at", "rebuild_state", "waits_for_a_seat"]

log = logging.getLogger("deckhands.controller.rebuild")

_ON_AN_ACTION = frozenset(
    {Awaiting.SECURITY, Awaiting.CONFIRMATION, Awaiting.RUNTIME, Awaiting.DELEGATE}
)
_ENDED = frozenset({AgentState.FINISHED, AgentState.STOPPED, AgentState.REJECTED, AgentState.ERROR})


def is_logged_input(entry: EventBase) -> bool:
    """Whether the entry is an input the controller applied and logged as it came, rather than
    one the controller wrote in answer to an input."""
    if isinstance(
        entry,
        TaskCreatedObservation
        | AgentStateChangedObservation
        | UserRejectObservation
        | LoopHintObservation,
    ):
        return False
    return not (
        isinstance(entry, ErrorObservation)
        and entry.source is EventSource.ENVIRONMENT
        and entry.error_code in CONTROLLER_ERROR_CODES
    )


def rebuild_state(
    log_entries: Sequence[EventBase], next_input: EventBase | None = None
) -> TaskState:
    """The State the controller had after logging `log_entries` (the task's whole log, in any
    order). `next_input` is the input about to be applied, if any (see the module docstring)."""
    entries = _in_order(log_entries)
    state = _created_state(entries)
    for after_turn, _ in _replay(entries):
        state = after_turn
    return _finished(state, entries, next_input)


def rebuild_at(log_entries: Sequence[EventBase], at: int) -> tuple[TaskState, int]:
    """The State after the turn that logged seq `at`, and that turn's last seq: a fork's
    starting point (services/controller/fork.py). A turn is never split: one whose input is
    at or before `at` is taken whole. If the task was then waiting on an action (under
    review, awaiting confirmation, running, or a sub-task), the point is the turn before that
    action's: the fork's agent chooses its next action again rather than inherit one it must
    not run twice (the runtime keeps each action id's result)."""
    entries = _in_order(log_entries)
    turns = list(_replay(entries)) or [(_created_state(entries), 1)]
    ends = [(state, entries[pos - 1].seq or pos) for state, pos in turns]
    chosen = next(((st, end) for st, end in ends if end >= at), ends[-1])
    waited = _waited_action_seq(chosen[0], entries)
    if waited is not None:
        chosen = next(((st, end) for st, end in reversed(ends) if end < waited), ends[0])
    state, end = chosen
    return _finished(state, entries[:end], None), end


def _created_state(entries: list[EventBase]) -> TaskState:
    first = entries[0]
    if not isinstance(first, TaskCreatedObservation):
        raise RebuildError(f"task {first.task_id}: the log does not open with its creation")
    return _created(first, entries)


def _waited_action_seq(state: TaskState, entries: list[EventBase]) -> int | None:
    """The seq of the action `state` waits on, if it waits on one."""
    if state.awaiting not in _ON_AN_ACTION:
        return None
    wanted = state.pending_action.id if state.pending_action is not None else state.awaiting_id
    return next((e.seq for e in entries if e.id == wanted), None)


def _replay(entries: list[EventBase]) -> Iterator[tuple[TaskState, int]]:
    """Each turn of the log replayed: the State after it, and the position after its last
    entry."""
    state = _created_state(entries)
    pos = 1
    while pos < len(entries):
        entry = entries[pos]
        if not is_logged_input(entry):
            state = _as_logged(state, entry)
            pos += 1
            yield state, pos
            continue
        # The first turn also wrote the creation entry, before its input.
        start = 0 if state.last_seq == 0 else pos
        turn = Turn(_expecting(state, entry), replaying=True)
        if isinstance(entry, RewindAction):
            # A rewind's point is in the log before it, which apply() does not see.
            back = entry.rewound_to
            rewind(turn, entry, None if back is None else rebuild_at(entries[:pos], entry.to))
        else:
            apply(turn, entry)
        written = entries[start : start + len(turn.logged)]
        if turn.logged and _same_entries(turn.logged, written, entry):
            state = _settled(turn.state, written)
            pos = start + len(turn.logged)
        else:
            log.warning(
                "task %s: replaying %s %s wrote %s, the log has %s: following the log",
                entry.task_id,
                type(entry).__name__,
                entry.id,
                [_shape(e) for e in turn.logged],
                [_shape(e) for e in written],
            )
            state = _as_logged(state, entry)
            pos += 1
        yield state, pos


def _in_order(log_entries: Sequence[EventBase]) -> list[EventBase]:
    """The entries by seq, each seq once (a republished entry is the same entry), gap-free."""
    by_seq: dict[int, EventBase] = {}
    for entry in log_entries:
        if entry.seq is not None:
            by_seq.setdefault(entry.seq, entry)
    if not by_seq:
        raise RebuildError("the log is empty")
    entries = [by_seq[s] for s in sorted(by_seq)]
    for expected, entry in enumerate(entries, start=1):
        if entry.seq != expected:
            raise RebuildError(f"task {entry.task_id}: the log has no entry {expected}")
    return entries


def _created(first: TaskCreatedObservation, entries: list[EventBase]) -> TaskState:
    # The task's text is its first user message (the gateway's, or the parent's delegation).
    text = next(
        (
            e.content
            for e in entries
            if isinstance(e, MessageAction) and e.source is EventSource.USER
        ),
        "",
    )
    return state_from_created(first, text)


def _expecting(state: TaskState, entry: EventBase) -> TaskState:
    """The State as it was when `entry` came: an answer to a step request names the request,
    whose id the replay cannot know (the live request had a random one)."""
    if (
        state.awaiting is Awaiting.AGENT
        and entry.source is not EventSource.USER
        and entry.cause is not None
    ):
        return state.model_copy(update={"awaiting_id": entry.cause})
    return state


def _shape(entry: EventBase) -> str:
    kind = getattr(entry, "kind", type(entry).__name__)
    if isinstance(entry, AgentStateChangedObservation):
        return f"{kind}:{entry.agent_state.value}"
    if isinstance(entry, ErrorObservation):
        return f"{kind}:{entry.error_code}"
    return str(kind)


def _same_entries(replayed: list[EventBase], logged: list[EventBase], entry: EventBase) -> bool:
    """The replayed turn wrote what the live one did (ids and times of written entries aside)."""
    if len(replayed) != len(logged) or entry.id not in {e.id for e in logged}:
        return False
    return [_shape(e) for e in replayed] == [_shape(e) for e in logged]


def _settled(state: TaskState, written: list[EventBase]) -> TaskState:
    """The replayed turn's State with the log's own seqs and times."""
    update: dict[str, object] = {"last_seq": written[-1].seq, "updated_at": written[-1].timestamp}
    if state.finished_at is not None:
        ended = [e for e in written if isinstance(e, AgentStateChangedObservation)]
        if ended:
            update["finished_at"] = ended[-1].timestamp
    return state.model_copy(update=update)


def _as_logged(state: TaskState, entry: EventBase) -> TaskState:
    """An entry no replayed input wrote: the state change of an input that is not logged (an
    overdue or dead-lettered answer ending the task in ERROR), taken as the log has it."""
    update: dict[str, object] = {"last_seq": entry.seq, "updated_at": entry.timestamp}
    if isinstance(entry, AgentStateChangedObservation):
        target = entry.agent_state
        update |= {
            "agent_state": target,
            "reason": entry.reason,
            "finished_at": entry.timestamp if target in _ENDED else None,
        }
        if target in _ENDED:
            update |= {
                "awaiting": Awaiting.NOTHING,
                "awaiting_id": None,
                "pending_action": None,
                "approval": None,
            }
    return state.model_copy(update=update)


def _finished(
    state: TaskState, entries: list[EventBase], next_input: EventBase | None
) -> TaskState:
    last = entries[-1]
    known = {e.id for e in entries}
    awaiting_id = state.awaiting_id
    if state.awaiting is Awaiting.AGENT:
        awaiting_id = _answered_step(next_input, known)
    inputs = [e.id for e in entries if is_logged_input(e)]
    return state.model_copy(
        update={
            "version": 0,
            "last_seq": last.seq,
            "updated_at": last.timestamp,
            "awaiting_id": awaiting_id,
            "awaiting_attempt": 0,
            "awaiting_deadline": None,
            "unseen_events": None,
            "unseen_bytes": 0,
            "processed": inputs[-PROCESSED_KEPT:],
            "outboxes": {},
        }
    )


def _answered_step(next_input: EventBase | None, known: set[str]) -> str | None:
    """The step request `next_input` answers, when it answers one the log does not name (the
    reasoner's action, its rate-limit notice, or a notice that the step went unanswered)."""
    if next_input is None or next_input.source is EventSource.USER:
        return None
    cause = next_input.cause
    return cause if cause is not None and cause not in known else None


def waits_for_a_seat(log_entries: Sequence[EventBase], state: TaskState) -> bool:
    """Whether the rebuilt `state` awaits an action that, as its log last said, waits for a
    sandbox seat: the runtime kept that order in Redis, so it must be sent again."""
    if state.awaiting is not Awaiting.RUNTIME or state.awaiting_id is None:
        return False
    about = [e for e in log_entries if e.cause is not None and e.cause == state.awaiting_id]
    return bool(about) and isinstance(
        max(about, key=lambda e: e.seq or 0), SandboxQueuedObservation
    )
