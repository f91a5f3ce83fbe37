"""The operator's MCP servers (DECKHANDS_MCP_SERVERS) and how their tools are named to the LLM.

An MCP server is a stdio command the service starts (`command`) or a streamable HTTP endpoint
(`url`). The reasoner lists their tools at start-up and offers each as `mcp__<server>__<tool>`
next to the built-in tools; a call becomes an `MCPCallAction` that the security monitor reviews
like any runnable action and the runtime carries out (shared/mcp_client.py).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["McpServerConfig", "McpTool", "function_name", "parse_function_name"]

_PREFIX = "mcp__"
# OpenAI-style function names: [a-zA-Z0-9_-]{1,64}.
_FUNCTION = re.compile(r"^mcp__([a-z0-9][a-z0-9-]{0,19})__([A-Za-z0-9_-]{1,40})$")


class McpServerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]{0,19}$",
        description="Short name; its tools are offered as mcp__<name>__<tool>.",
    )
    command: list[str] | None = Field(
        default=None, min_length=1, description="A stdio server: the command and its arguments."
    )
    url: str | None = Field(default=None, description="A streamable HTTP server's endpoint.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment of a stdio server."
    )
    cwd: str | None = Field(default=None, description="Working directory of a stdio server.")
    timeout_s: float = Field(default=60.0, gt=0, le=600, description="One call's deadline.")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of command or url")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name!r}: url must be http(s)")
        return self


class McpTool(BaseModel):
    """One tool of one server, as the LLM is offered it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: str
    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})

    @property
    def function(self) -> str:
        return function_name(self.server, self.name)

    def spec(self) -> dict[str, Any]:
        """An OpenAI-style function-calling schema."""
        parameters = dict(self.input_schema)
        parameters.setdefault("type", "object")
        parameters.setdefault("properties", {})
        return {
            "type": "function",
            "function": {
                "name": self.function,
                "description": f"[MCP server {self.server}] {self.description}".strip(),
                "parameters": parameters,
            },
        }


def function_name(server: str, tool: str) -> str:
    return f"{_PREFIX}{server}__{tool}"


def parse_function_name(name: str) -> tuple[str, str] | None:
    """(server, tool) of an `mcp__<server>__<tool>` name; None for any other name."""
    match = _FUNCTION.fullmatch(name)
    return None if match is None else (match.group(1), match.group(2))
