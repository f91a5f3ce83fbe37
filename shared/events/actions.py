"""Actions: what a user or the agent asks to happen (seeds 001 and 004)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..egress_policy import EgressPolicy
from .base import BlobRef, EventBase
from .state import AgentState

__all__ = [
    "AgentDelegateAction",
    "AgentFinishAction",
    "AgentThinkAction",
    "ChangeAgentStateAction",
    "CmdRunAction",
    "CondensationAction",
    "FileEditAction",
    "FileReadAction",
    "FileWriteAction",
    "InstructionsUsed",
    "LLMUsage",
    "MCPCallAction",
    "MessageAction",
    "PlannedCall",
    "RunPythonAction",
]


class LLMUsage(BaseModel):
    """Tokens and cost of the LLM call that produced an agent action."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0


class InstructionsUsed(BaseModel):
    """Repository instructions (AGENTS.md) that joined the system prompt of the LLM call."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="The file in /workspace, e.g. AGENTS.md.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Of the text the prompt held.")
    bytes: int = Field(ge=0, description="Bytes of it in the prompt (bounded).")


class PlannedCall(BaseModel):
    """A tool call the model wrote after the one its action runs, in the same reply."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str
    arguments: str = Field(description="The call's arguments, a JSON object.")


class _AgentActionFields(EventBase):
    thought: str = Field(default="", description="Text the model wrote alongside its tool call.")
    tool_call_id: str | None = Field(default=None, description="Links the result to the call.")
    llm_usage: LLMUsage | None = None
    planned: tuple[PlannedCall, ...] = Field(
        default=(),
        max_length=8,
        description="The calls the model wrote after this one in the same reply, in order. "
        "Each runs next, without asking the model, while the one before succeeded; a failure, "
        "a user's message or a loop hint drops the rest, and the model is asked again.",
    )
    instructions: InstructionsUsed | None = Field(
        default=None,
        description="Set on the first action whose prompt held these repository instructions "
        "(the workspace's AGENTS.md or .openhands/microagents/repo.md); later prompts hold "
        "them too until they change.",
    )


class MessageAction(_AgentActionFields):
    kind: Literal["message"] = "message"
    content: str
    wait_for_response: bool = False
    network: EgressPolicy | None = Field(
        default=None,
        description="A user's message only: rules it adds to the task's egress policy, within "
        "the task's bound (the gateway checks it); logged with the message, in force from the "
        "task's next action.",
    )


class CmdRunAction(_AgentActionFields):
    kind: Literal["run"] = "run"
    command: str
    on_agents_behalf: bool = Field(
        default=False,
        description="Run by deckhands before the model's first step (the first look at the "
        "working directory), not chosen by the model: its prompt shows the output as context, "
        "not as a call of its own to imitate, and the stuck detector does not count it.",
    )
    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    is_input: bool = Field(
        default=False,
        description="Send `command` as input to the command still running (after a no-output "
        "timeout) instead of running it: 'C-c' interrupts, '' waits for more output.",
    )
    no_output_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="Return the output so far after this long without new output, leaving the "
        "command running; None uses the runtime's default.",
    )


class RunPythonAction(_AgentActionFields):
    kind: Literal["run_python"] = "run_python"
    code: str
    timeout_s: float | None = Field(default=None, gt=0, le=3600)


class FileReadAction(_AgentActionFields):
    kind: Literal["read"] = "read"
    path: str
    start_line: int = Field(default=1, ge=1)
    end_line: int | None = Field(
        default=None, ge=1, description="Inclusive; None reads to the end."
    )


class FileWriteAction(_AgentActionFields):
    kind: Literal["write"] = "write"
    path: str
    content: str = Field(description="The file's content; empty when `content_ref` holds it.")
    content_ref: BlobRef | None = Field(
        default=None,
        description="The content, kept in the blob store when too large to travel in an event.",
    )


class FileEditAction(_AgentActionFields):
    """The OpenHands editor: view, create, str_replace, insert and undo; edits return a diff."""

    kind: Literal["edit"] = "edit"
    command: Literal["view", "create", "str_replace", "insert", "undo"]
    path: str
    file_text: str | None = Field(default=None, description="create: the new file's content.")
    old_str: str | None = Field(
        default=None, description="str_replace: text that must occur exactly once."
    )
    new_str: str | None = Field(default=None, description="str_replace and insert: new text.")
    insert_line: int | None = Field(
        default=None, ge=0, description="insert: after this line (0 = at the top)."
    )
    view_range: list[int] | None = Field(
        default=None,
        min_length=2,
        max_length=2,
        description="view: [first, last] lines, last -1 for the end.",
    )


class MCPCallAction(_AgentActionFields):
    """A call of a tool of one of the operator's MCP servers (shared/mcp_config.py): reviewed
    by the security monitor, carried out by the runtime."""

    kind: Literal["mcp_call"] = "mcp_call"
    server: str = Field(description="The server's name in DECKHANDS_MCP_SERVERS.")
    tool: str = Field(description="The tool's own name on that server.")
    arguments: dict[str, Any] = Field(default_factory=dict)


class AgentThinkAction(_AgentActionFields):
    kind: Literal["think"] = "think"


class AgentFinishAction(_AgentActionFields):
    kind: Literal["finish"] = "finish"
    final_message: str = ""
    outputs: dict[str, Any] = Field(default_factory=dict)


class ChangeAgentStateAction(EventBase):
    """A request to move the task to another state, e.g. a user's stop."""

    kind: Literal["change_agent_state"] = "change_agent_state"
    agent_state: AgentState
    reason: str = ""


class AgentDelegateAction(_AgentActionFields):
    """Start a sub-task with its own state and iteration budget; the parent waits for it."""

    kind: Literal["delegate"] = "delegate"
    task: str = Field(min_length=1)
    max_iterations: int | None = Field(default=None, ge=1, le=1000)


class CondensationAction(_AgentActionFields):
    """The reasoner shortened the history it sends to the LLM (seed 002, condenser)."""

    kind: Literal["condensation"] = "condensation"
    forgotten_up_to_seq: int = Field(ge=0, description="Events up to this seq were summarised.")
    summary: str = ""
