"""The states a task's agent can be in (seed 001, AgentState)."""

from enum import StrEnum

__all__ = [
    "LEGAL_TRANSITIONS",
    "SANDBOX_ENDING_STATES",
    "TERMINAL_STATES",
    "AgentState",
    "TaskPriority",
    "can_transition",
]


class AgentState(StrEnum):
    LOADING = "LOADING"
    RUNNING = "RUNNING"
    AWAITING_USER_INPUT = "AWAITING_USER_INPUT"
    AWAITING_USER_CONFIRMATION = "AWAITING_USER_CONFIRMATION"
    USER_CONFIRMED = "USER_CONFIRMED"
    USER_REJECTED = "USER_REJECTED"
    PAUSED = "PAUSED"
    STOPPED = "STOPPED"
    FINISHED = "FINISHED"
    REJECTED = "REJECTED"
    ERROR = "ERROR"
    RATE_LIMITED = "RATE_LIMITED"


class TaskPriority(StrEnum):
    """Which of its tenant's queued tasks takes a free seat first: an interactive one (a person
    waits for it: the console's and the CLI's default) goes ahead of the tenant's batch ones
    (an evaluation, a migration of many repositories). Between tenants, seats are shared by
    weight whatever the priority (shared/admission.py)."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


TERMINAL_STATES = frozenset(
    {AgentState.FINISHED, AgentState.STOPPED, AgentState.REJECTED, AgentState.ERROR}
)

# After these a task never runs another action, so its sandbox is destroyed. ERROR is terminal
# for a run but not for the task: a user message resumes it, with its workspace.
SANDBOX_ENDING_STATES = frozenset({AgentState.FINISHED, AgentState.STOPPED, AgentState.REJECTED})


# Which states a task may move to from each state; anything else is refused.
LEGAL_TRANSITIONS: dict[AgentState, frozenset[AgentState]] = {
    AgentState.LOADING: frozenset({AgentState.RUNNING, AgentState.STOPPED, AgentState.ERROR}),
    AgentState.RUNNING: frozenset(
        {
            AgentState.AWAITING_USER_INPUT,
            AgentState.AWAITING_USER_CONFIRMATION,
            AgentState.PAUSED,
            AgentState.STOPPED,
            AgentState.FINISHED,
            AgentState.REJECTED,
            AgentState.ERROR,
            AgentState.RATE_LIMITED,
        }
    ),
    AgentState.AWAITING_USER_INPUT: frozenset(
        {AgentState.RUNNING, AgentState.PAUSED, AgentState.STOPPED, AgentState.ERROR}
    ),
    AgentState.AWAITING_USER_CONFIRMATION: frozenset(
        {
            AgentState.USER_CONFIRMED,
            AgentState.USER_REJECTED,
            AgentState.PAUSED,
            AgentState.STOPPED,
            AgentState.ERROR,
        }
    ),
    AgentState.USER_CONFIRMED: frozenset(
        {AgentState.RUNNING, AgentState.PAUSED, AgentState.STOPPED, AgentState.ERROR}
    ),
    AgentState.USER_REJECTED: frozenset(
        {AgentState.RUNNING, AgentState.AWAITING_USER_INPUT, AgentState.STOPPED, AgentState.ERROR}
    ),
    AgentState.PAUSED: frozenset({AgentState.RUNNING, AgentState.STOPPED, AgentState.ERROR}),
    AgentState.RATE_LIMITED: frozenset(
        {AgentState.RUNNING, AgentState.PAUSED, AgentState.STOPPED, AgentState.ERROR}
    ),
    # A finished or failed task can be continued by a new user message, as in OpenHands.
    AgentState.FINISHED: frozenset({AgentState.RUNNING, AgentState.STOPPED}),
    AgentState.ERROR: frozenset({AgentState.RUNNING, AgentState.STOPPED}),
    AgentState.REJECTED: frozenset({AgentState.RUNNING, AgentState.STOPPED}),
    AgentState.STOPPED: frozenset(),
}


def can_transition(current: AgentState, target: AgentState) -> bool:
    return target in LEGAL_TRANSITIONS[current]
