"""A rewind (issue 28, item 4): a paused or ended task goes back to a seq of its log and on from
there, a fork in place.

The log keeps everything: the rewind is logged, and what came after the point up to it is out
of the task's course (shared.forks.in_course: the agent's history leaves it out, the files go
back). The State takes from the point's (rebuild.rebuild_at, which the caller gives, as the
log alone knows it) what is the agent's course: its step count, its stuck detector's memory,
what it awaits, its files; it keeps what was spent (usage, sub-tasks' spend), its limits, and
its egress policy. The next action's order asks the runtime to put the point's files back
first (`restore_first`), in the task's own sandbox.
"""

from __future__ import annotations

from shared.events import AgentState, RewindAction
from shared.forks import REWINDABLE, parse_checkpoint
from shared.state import Awaiting, TaskState

from ..turn import Turn
from .common import refuse
from .from_user import raise_limits
from .missing_answers import ask_for_lost_step
from .next_hop import request_step

__all__ = ["rewind"]


def rewind(
    turn: Turn, event: RewindAction, point: tuple[TaskState, int] | None, why_not: str = ""
) -> None:
    """Rewind the task to `point` (the State at the seq it goes back to, and that seq); None:
    refused, for `why_not`."""
    s = turn.state
    if point is None or s.agent_state not in REWINDABLE or s.parent_task_id:
        turn.log(event.model_copy(update={"rewound_to": None}))
        if s.parent_task_id:
            why_not = "a sub-task is rewound with its root task"
        elif s.agent_state not in REWINDABLE:
            why_not = (
                f"the task is {s.agent_state.value}: only a paused or ended task can be rewound"
            )
        refuse(turn, event, why_not or "the task's log cannot give that point")
        return
    at, back = point
    logged = turn.log(event.model_copy(update={"rewound_to": back}))
    owner, seq = parse_checkpoint(event.checkpoint) if event.checkpoint else (None, None)
    turn.update(
        iteration=at.iteration,
        recent=at.recent,
        result=at.result,
        awaiting=Awaiting.NOTHING,
        awaiting_id=None,
        awaiting_attempt=0,
        pending_action=None,
        approval=None,
        action_scope=None,
        requeue_if_queued=False,
        checkpoint_seq=seq,
        checkpoint_task=None if owner in (None, s.task_id) else owner,
        rewound_at=logged.seq,
        restore_first=True,
        checkpoint_due=None,  # an upload after the point is out of its course too
        unseen_events=None,
        unseen_bytes=0,
    )
    raise_limits(turn)
    reason = f"rewound to seq {back}"
    turn.change_state(AgentState.RUNNING, reason, cause=logged.id)
    if at.awaiting is Awaiting.USER and at.awaiting_id is not None:
        # The agent had asked a question there: it waits for the answer again.
        turn.change_state(AgentState.AWAITING_USER_INPUT, reason, cause=logged.id)
        turn.update(awaiting=Awaiting.USER, awaiting_id=at.awaiting_id)
        return
    if at.awaiting is Awaiting.AGENT:
        # The point had asked for the next step (and counted it): that step is asked again.
        ask_for_lost_step(turn)
        return
    request_step(turn)
