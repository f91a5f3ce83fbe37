"""What can go wrong in the controller: every exception of its own derives from ControllerError."""

from __future__ import annotations

from shared.delivery import NotYet
from shared.events import AgentState

__all__ = ["ControllerError", "IllegalTransition", "RebuildError", "TaskNotMadeYet"]


class ControllerError(Exception):
    """The root of the controller's own exceptions: a failure of its logic, not of a library
    or of the stores it uses."""


class IllegalTransition(ControllerError):
    def __init__(self, current: AgentState, target: AgentState) -> None:
        super().__init__(f"cannot go from {current.value} to {target.value}")
        self.current, self.target = current, target


class RebuildError(ControllerError):
    """The log cannot rebuild a State: it is empty, has a hole, or does not open with the
    task's creation (a task created before TaskCreatedObservation existed)."""


class TaskNotMadeYet(ControllerError, NotYet):
    """An input for a task the gateway has asked to make, before the controller made it: it is
    redelivered until the task is made (not dead-lettered)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id} is not made yet (its creation request is queued)")
