"""The states a task's agent can be in (seed 001, AgentState)."""

from enum import StrEnum

__all__ = ["TERMINAL_STATES", "AgentState"]


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


TERMINAL_STATES = frozenset(
    {AgentState.FINISHED, AgentState.STOPPED, AgentState.REJECTED, AgentState.ERROR}
)
