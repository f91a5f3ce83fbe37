"""What an LLM reply says and costs: its content and tool calls, its tokens and price, counted
in the metrics; and the price entry of a model litellm does not know."""

from __future__ import annotations

from typing import Any

from shared.events import LLMUsage

from .metrics import LLM_COMPLETION_TOKENS, LLM_COST, LLM_PROMPT_TOKENS
from .replies import LLMReply
from .settings import ReasonerSettings
from .tools import ToolCall

__all__ = ["cost_usd", "register_unpriced_model", "reply_of", "tokens_used"]


def reply_of(
    settings: ReasonerSettings, litellm: Any, response: Any, latency_s: float, model: str
) -> LLMReply:
    """The reply in a completion response of `model`, with its usage."""
    message = response.choices[0].message
    calls = [
        ToolCall(
            name=str(getattr(tc.function, "name", "") or ""),
            arguments=getattr(tc.function, "arguments", None) or "",
            id=getattr(tc, "id", None) or None,
        )
        for tc in (getattr(message, "tool_calls", None) or [])
    ]
    usage = getattr(response, "usage", None)
    prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    cost = cost_usd(settings, litellm, response, prompt_tokens, completion_tokens)
    LLM_PROMPT_TOKENS.labels(model).inc(prompt_tokens)
    LLM_COMPLETION_TOKENS.labels(model).inc(completion_tokens)
    LLM_COST.labels(model).inc(cost)
    return LLMReply(
        content=str(getattr(message, "content", None) or ""),
        tool_calls=calls,
        usage=LLMUsage(
            model=model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=cost,
            latency_ms=round(latency_s * 1000, 1),
        ),
    )


def cost_usd(
    settings: ReasonerSettings, litellm: Any, response: Any, prompt_tokens: int, completion: int
) -> float:
    """The reply's price: from the configured prices, else as litellm priced it."""
    s = settings
    if s.llm_input_cost_per_token is not None or s.llm_output_cost_per_token is not None:
        return prompt_tokens * (s.llm_input_cost_per_token or 0.0) + completion * (
            s.llm_output_cost_per_token or 0.0
        )
    # litellm priced the reply already (`response_cost` among its hidden params): pricing it
    # again is a second walk through its cost code on every call.
    hidden = getattr(response, "_hidden_params", None)
    priced = hidden.get("response_cost") if isinstance(hidden, dict) else None
    if isinstance(priced, int | float):
        return float(priced)
    try:
        return float(litellm.completion_cost(completion_response=response) or 0.0)
    except Exception:
        return 0.0  # a model litellm has no price for (local servers): free as far as we know


def register_unpriced_model(
    settings: ReasonerSettings, litellm: Any, model: str, native: bool | None
) -> None:
    """A model litellm has no entry for (a local or self-hosted server) gets one, with the
    configured prices (or none): litellm prices every reply, and for an unknown model it
    searches its whole map for a lookalike on each call."""
    try:
        litellm.get_model_info(model)
        return
    except Exception:
        pass
    s = settings
    litellm.register_model(
        {
            model: {
                "input_cost_per_token": s.llm_input_cost_per_token or 0.0,
                "output_cost_per_token": s.llm_output_cost_per_token or 0.0,
                "litellm_provider": model.split("/", 1)[0] if "/" in model else "openai",
                "mode": "chat",
                "supports_function_calling": bool(native),
            }
        }
    )


def tokens_used(response: Any) -> int | None:
    """The tokens a completion used in all, when its usage says."""
    usage = getattr(response, "usage", None)
    total = getattr(usage, "total_tokens", None)
    if isinstance(total, int):
        return total
    prompt = getattr(usage, "prompt_tokens", None)
    completion = getattr(usage, "completion_tokens", None)
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt + completion
    return None
