"""Answers that do not come: an overdue or dead-lettered request asked again or ending the task,
and a step whose request a rebuild could not know."""

from __future__ import annotations

from shared.commands import ReviewAction
from shared.events import AnswerMissingObservation
from shared.state import Awaiting
from shared.subjects import Service

from ..metrics import RE_REQUESTS, STALE
from ..turn import Turn
from .common import count
from .next_hop import execute_order, fail, step_request

__all__ = [
    "answer_missing",
    "ask_for_lost_step",
]

_ANSWERED_BY = {
    Awaiting.AGENT: "the reasoner (the agent's next step)",
    Awaiting.SECURITY: "the security monitor (the review of the action)",
    Awaiting.RUNTIME: "the runtime (the action's result)",
}


def answer_missing(turn: Turn, event: AnswerMissingObservation) -> None:
    """An overdue answer is asked for again, up to `turn.answer_retries` times; after that, or
    when the order was dead-lettered, the task ends in ERROR naming what did not answer."""
    s = turn.state
    who = _ANSWERED_BY.get(s.awaiting)
    if who is None:
        count(turn, STALE.labels(event.kind))
        return
    if event.why == "overdue" and s.awaiting_attempt < turn.answer_retries:
        _ask_again(turn)
        return
    if event.why == "overdue":
        reason = f"no answer from {who} after {s.awaiting_attempt + 1} requests"
    else:
        reason = f"{who} gave up on this task's order: {event.detail}"
    turn.update(pending_action=None)
    fail(turn, reason[:1000])


def _ask_again(turn: Turn) -> None:
    """The same request once more. A step gets a new id (a late answer to the old one is then
    stale); an action keeps its id, so the runtime never runs it twice."""
    s = turn.state
    turn.update(awaiting_attempt=s.awaiting_attempt + 1)
    if s.awaiting is Awaiting.AGENT:
        step = step_request(s, s.iteration)
        turn.update(awaiting_id=step.id)
        turn.send(Service.REASONER, step)
    elif s.pending_action is not None and s.awaiting is Awaiting.SECURITY:
        turn.send(Service.SECURITY, ReviewAction(task_id=s.task_id, action=s.pending_action))
    elif s.pending_action is not None and s.awaiting is Awaiting.RUNTIME:
        turn.send(Service.RUNTIME, execute_order(s, s.pending_action))
    count(turn, RE_REQUESTS.labels(s.awaiting.value))


def ask_for_lost_step(turn: Turn) -> None:
    """A State rebuilt from the log awaits a step whose request id no entry names (requests are
    not logged): ask for the step again, under a new id. A late answer to the lost request is
    then stale and ignored."""
    s = turn.state
    step = step_request(s, s.iteration)
    turn.update(awaiting=Awaiting.AGENT, awaiting_id=step.id)
    turn.send(Service.REASONER, step)
    count(turn, RE_REQUESTS.labels(Awaiting.AGENT.value))
