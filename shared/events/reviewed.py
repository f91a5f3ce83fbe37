"""An action together with the security monitor's ruling on it: one message, two log entries.

The reasoner sends each runnable action to the security monitor rather than to the controller;
the monitor answers the controller with both, so a step costs the controller one turn fewer
(log the action, log the verdict, order the run) and the action one hop less on its way to
the sandbox. The controller logs the two as they always were: this wrapper is never logged.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .actions import (
    CmdRunAction,
    FileEditAction,
    FileReadAction,
    FileWriteAction,
    MCPCallAction,
    RunPythonAction,
)
from .agent_tools import ApplyPatchAction, GlobAction, GrepAction
from .base import EventBase
from .observations import SecurityVerdictObservation

__all__ = ["ReviewedAction", "RunnableAction"]

RunnableAction = Annotated[
    CmdRunAction
    | RunPythonAction
    | FileReadAction
    | FileWriteAction
    | FileEditAction
    | MCPCallAction
    | GlobAction
    | GrepAction
    | ApplyPatchAction,
    Field(discriminator="kind"),
]


class ReviewedAction(EventBase):
    """Security monitor → controller: `action` (which answers a step: `cause` is its step
    request, as the action's own) and `verdict` on it. Sent for every review, whoever asked for
    it; the controller takes the action from it only while it awaits that step, and otherwise
    the verdict alone."""

    kind: Literal["reviewed_action"] = "reviewed_action"
    action: RunnableAction
    verdict: SecurityVerdictObservation
