"""The one discriminated union of every event, and the sets services route on."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, TypeAdapter

from .actions import (
    AgentDelegateAction,
    AgentFinishAction,
    AgentThinkAction,
    ChangeAgentStateAction,
    CmdRunAction,
    CondensationAction,
    FileEditAction,
    FileReadAction,
    FileWriteAction,
    MCPCallAction,
    MessageAction,
    RunPythonAction,
)
from .agent_tools import ApplyPatchAction, GlobAction, GrepAction, TaskTrackerAction
from .checkpoints import (
    RewindAction,
    WorkspaceCheckpointObservation,
    WorkspaceUploadedObservation,
)
from .egress import EgressActivityObservation
from .observations import (
    AgentDelegateObservation,
    AgentStateChangedObservation,
    AnswerMissingObservation,
    CmdOutputObservation,
    ErrorObservation,
    FileEditObservation,
    FileReadObservation,
    FileWriteObservation,
    LoopHintObservation,
    MCPCallObservation,
    PythonOutputObservation,
    SandboxQueuedObservation,
    SecurityVerdictObservation,
    TaskCreatedObservation,
    UserRejectObservation,
)
from .reviewed import ReviewedAction

__all__ = [
    "ACTION_TYPES",
    "ENVELOPE_TYPES",
    "OBSERVATION_TYPES",
    "RUNNABLE_ACTION_TYPES",
    "Event",
    "EventAdapter",
]

Event = Annotated[
    MessageAction
    | CmdRunAction
    | RunPythonAction
    | FileReadAction
    | FileWriteAction
    | FileEditAction
    | AgentThinkAction
    | AgentFinishAction
    | ChangeAgentStateAction
    | AgentDelegateAction
    | CondensationAction
    | MCPCallAction
    | GlobAction
    | GrepAction
    | ApplyPatchAction
    | TaskTrackerAction
    | CmdOutputObservation
    | PythonOutputObservation
    | FileReadObservation
    | FileWriteObservation
    | FileEditObservation
    | ErrorObservation
    | AgentStateChangedObservation
    | SecurityVerdictObservation
    | UserRejectObservation
    | AgentDelegateObservation
    | AnswerMissingObservation
    | SandboxQueuedObservation
    | TaskCreatedObservation
    | MCPCallObservation
    | EgressActivityObservation
    | WorkspaceCheckpointObservation
    | WorkspaceUploadedObservation
    | LoopHintObservation
    | RewindAction
    | ReviewedAction,
    Field(discriminator="kind"),
]

EventAdapter: TypeAdapter[Event] = TypeAdapter(Event)

RUNNABLE_ACTION_TYPES = (
    CmdRunAction,
    RunPythonAction,
    FileReadAction,
    FileWriteAction,
    FileEditAction,
    MCPCallAction,
    GlobAction,
    GrepAction,
    ApplyPatchAction,
)
ACTION_TYPES = (
    MessageAction,
    *RUNNABLE_ACTION_TYPES,
    AgentThinkAction,
    AgentFinishAction,
    ChangeAgentStateAction,
    AgentDelegateAction,
    CondensationAction,
    RewindAction,
    TaskTrackerAction,
)
OBSERVATION_TYPES = (
    CmdOutputObservation,
    PythonOutputObservation,
    FileReadObservation,
    FileWriteObservation,
    FileEditObservation,
    ErrorObservation,
    AgentStateChangedObservation,
    SecurityVerdictObservation,
    UserRejectObservation,
    AgentDelegateObservation,
    AnswerMissingObservation,
    SandboxQueuedObservation,
    TaskCreatedObservation,
    MCPCallObservation,
    EgressActivityObservation,
    WorkspaceCheckpointObservation,
    WorkspaceUploadedObservation,
    LoopHintObservation,
)
# Messages that carry events to the controller but are never logged themselves.
ENVELOPE_TYPES = (ReviewedAction,)
