"""Settings of the reasoner: which LLM to call and how (DECKHANDS_LLM_* variables)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from shared.settings import CommonSettings

from .tools import TOOL_NAMES

__all__ = ["FallbackModel", "ModelLimits", "ReasonerSettings"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ModelLimits(BaseModel):
    """One model's limits across the deployment, every reasoner replica together (None: no
    limit of that kind). Set them a little under the provider's account limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrent: int | None = Field(default=None, ge=1, description="Calls in flight at once.")
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(
        default=None, ge=1, description="Prompt and completion tokens over a sliding minute."
    )


class FallbackModel(BaseModel):
    """A model to call when the ones before it in the chain are rate limited or down."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1, max_length=256, description="A litellm model name.")
    api_base: str | None = Field(
        default=None, description="Its endpoint; absent: the provider's (litellm's default)."
    )
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Z_][A-Z0-9_]{0,127}$",
        description="The environment variable holding its API key; absent: litellm's own for "
        "the provider (OPENAI_API_KEY, ANTHROPIC_API_KEY...).",
    )


class ReasonerSettings(CommonSettings):
    llm_model: str = Field(
        default="",
        description="litellm model name, e.g. openai/gpt-4o-mini, "
        "anthropic/claude-3-5-haiku-latest, ollama/qwen2.5-coder:1.5b, or openai/<name> for any "
        "OpenAI-compatible server.",
    )
    llm_api_base: str | None = Field(
        default=None,
        description="Base URL of an OpenAI-compatible server, e.g. http://host:8080/v1.",
    )
    llm_api_key: SecretStr | None = Field(
        default=None, description="Never logged. Unset: litellm reads the provider's own variable."
    )
    llm_temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    llm_timeout_s: float = Field(default=120.0, gt=0, description="One LLM call, in seconds.")
    llm_num_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Retries of one LLM call on timeouts, connection errors and 5xx, with "
        "backoff, before the step goes back to JetStream for redelivery.",
    )
    llm_retry_backoff_s: float = Field(
        default=1.0, gt=0, description="First wait before retrying an LLM call; doubles each time."
    )
    llm_retry_backoff_max_s: float = Field(
        default=60.0, gt=0, description="Longest single wait, a provider's Retry-After included."
    )
    llm_rate_limit_max_wait_s: float = Field(
        default=600.0,
        ge=0,
        description="How long one delivery of a step waits out rate limits (the task shows "
        "RATE_LIMITED meanwhile) before giving the step back to JetStream.",
    )
    llm_max_input_tokens: int = Field(
        default=24000,
        ge=0,
        description="Prompt budget: a longer prompt is condensed first (a CondensationAction). "
        "0: condense only when the provider reports a context window overflow.",
    )
    llm_native_tool_calling: Literal["auto", "true", "false"] = Field(
        default="auto",
        description="Offer tools as function calls ('true'), describe them in the prompt and parse "
        "the call from the text ('false'), or ask litellm whether the model supports them.",
    )
    llm_tool_choice: Literal["auto", "required"] = Field(
        default="auto", description="'required' forces a tool call, which some small models need."
    )
    llm_max_output_tokens: int = Field(
        default=1024, ge=0, description="Cap on a reply's tokens; 0 leaves the provider's default."
    )
    llm_openai_sdk: bool = Field(
        default=False,
        description="Send calls to OpenAI and OpenAI-compatible servers through the OpenAI SDK "
        "instead of litellm's own HTTP client. Off by default: the SDK re-walks every message "
        "of the conversation against its type hints on each call, which took two thirds of the "
        "reasoner's CPU per step (26 ms against 10 ms for a 10-step conversation).",
    )
    llm_input_cost_per_token: float | None = Field(
        default=None,
        ge=0,
        description="USD per prompt token, for models litellm has no price for (self-hosted); "
        "unset uses litellm's cost map.",
    )
    llm_output_cost_per_token: float | None = Field(
        default=None, ge=0, description="USD per completion token; see llm_input_cost_per_token."
    )

    workers: int = Field(
        default=512,
        ge=1,
        description="Step requests one replica handles at once. A step mostly waits (storage, the "
        "LLM), so this is high; what is scarce is bounded by llm_max_concurrency.",
    )
    max_action_bytes: int = Field(
        default=256 * 1024,
        ge=4096,
        le=512 * 1024,
        description="Largest action (encoded JSON) the agent may send; a larger one is answered "
        "with an ErrorObservation asking for smaller steps. Below NATS' max_payload with room "
        "for the messages that carry it.",
    )
    max_write_bytes: int = Field(
        default=16 << 20,
        ge=0,
        le=256 << 20,
        description="Largest file the agent may write in one action. A write larger than "
        "max_action_bytes travels as a claim check: its content goes to the blob store and the "
        "action refers to it. 0 refuses every write over max_action_bytes.",
    )
    llm_max_concurrency: int = Field(
        default=256,
        ge=1,
        description="LLM requests one replica has in flight at once (the provider's concurrency "
        "limit); a step beyond it waits for a free one without holding anything else.",
    )
    first_step_seat_wait_s: float = Field(
        default=300.0,
        ge=0,
        description="A task queued for a sandbox seat asks the LLM for its first step once it "
        "is seated, waiting at most this long (then it asks anyway); at most half the "
        "replica's workers wait so. A seated task, or one that comes while nobody queues, "
        "never waits. 0: every first step asks at once.",
    )
    llm_capacity: dict[str, ModelLimits] = Field(
        default_factory=dict,
        description="Per model (the DECKHANDS_LLM_MODEL name, or a fallback's), limits that "
        "hold across every reasoner replica (kept in Redis), as JSON: "
        '{"openai/gpt-4o": {"max_concurrent": 20, "requests_per_minute": 600, '
        '"tokens_per_minute": 200000}}. While calls wait for room, tenants are served by '
        "their seat weights. A model absent here has no limit but the provider's 429s, which "
        "pause it for the whole deployment.",
    )
    llm_fallback_models: list[FallbackModel] = Field(
        default_factory=list,
        max_length=8,
        description="Models to call, in order, when the ones before are paused by a 429 or "
        "down (failing after their retries), as JSON: "
        '[{"model": "anthropic/claude-3-5-haiku-latest", "api_key_env": "ANTHROPIC_API_KEY"}]. '
        "They are asked with the same prompt and tool calling mode.",
    )
    llm_capacity_notice_s: float = Field(
        default=2.0,
        ge=0,
        description="A call that waits this long for the model's capacity shows its task as "
        "RATE_LIMITED with the reason, until it gets room.",
    )
    history_wait_s: float = Field(
        default=3.0, ge=0, description="How long to wait for storage to catch up with a step."
    )
    history_request_timeout_s: float = Field(default=2.0, gt=0)
    history_page_size: int = Field(default=1000, ge=1, le=10000)
    history_page_bytes: int = Field(
        default=512 * 1024,
        ge=1024,
        description="About how many bytes of events one history reply carries; a longer history "
        "arrives in several pages (storage keeps each below NATS' max_payload).",
    )
    history_cache_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        description="Task history one replica keeps between steps, so a step reads only the "
        "events since the last one; least recently stepped tasks are dropped first.",
    )
    agent_withheld_tools: list[str] = Field(
        default_factory=list,
        description='Built-in tools not offered to the agent (JSON list, e.g. ["execute_python", '
        '"delegate"]); execute_bash and finish always are. For small models, which run a '
        "snippet when asked for a script and delegate small tasks.",
    )
    agent_first_look: str = Field(
        default="",
        description="A bash command run as the agent's first action, before the LLM is first "
        "asked (e.g. a listing of /workspace), so the model starts knowing what is there. "
        "Empty: none.",
    )
    agent_planned_calls: int = Field(
        default=4,
        ge=0,
        le=8,
        description="How many of the tool calls that follow the first in one reply run after "
        "it, in turn and without asking the model, while each succeeds (a finish among them "
        "is not run). 0: only a reply's first call runs.",
    )
    agent_review_finish: bool = Field(
        default=False,
        description="Answer the model's first finish (since the user last spoke) with the "
        "task's request and its final message, asking it to check its work; a second finish "
        "ends the task.",
    )
    max_observation_chars: int = Field(
        default=8000, ge=200, description="Longer outputs are cut in the middle in the prompt."
    )
    condenser_target_fraction: float = Field(
        default=0.6,
        gt=0.05,
        le=1.0,
        description="A condensation forgets enough old steps to bring the prompt under this "
        "fraction of the budget, so the next steps do not need another one at once.",
    )
    condenser_keep_recent: int = Field(
        default=4,
        ge=1,
        description="The most recent steps (an action with its result, or a message) are never "
        "condensed.",
    )
    condenser_max_summary_chars: int = Field(
        default=4000, ge=200, description="Bound on the summary that stands for condensed steps."
    )

    @field_validator("agent_withheld_tools")
    @classmethod
    def _known_tools(cls, value: list[str]) -> list[str]:
        withholdable = [n for n in TOOL_NAMES if n not in ("execute_bash", "finish")]
        wrong = [name for name in value if name not in withholdable]
        if wrong:
            raise ValueError(f"{wrong}: the tools that can be withheld are {withholdable}")
        return value

    @field_validator("llm_native_tool_calling", mode="before")
    @classmethod
    def _tri_state(cls, value: object) -> object:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in _TRUE:
                return "true"
            if lowered in _FALSE:
                return "false"
            return lowered
        return value

    def require_llm(self) -> None:
        """Called at start-up: a reasoner without a model cannot do anything useful."""
        if not self.llm_model.strip():
            raise RuntimeError(
                "DECKHANDS_LLM_MODEL is not set: give a litellm model name, e.g. "
                "openai/gpt-4o-mini, or openai/scripted with "
                "DECKHANDS_LLM_API_BASE=http://127.0.0.1:8765/v1 for the scripted server"
            )
