"""The one place that talks to the LLM, through litellm, whatever the provider."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from shared.events import LLMUsage

from .metrics import LLM_CALLS, LLM_COMPLETION_TOKENS, LLM_COST, LLM_LATENCY, LLM_PROMPT_TOKENS
from .replies import LLMReply
from .settings import ReasonerSettings
from .tools import TOOL_SPECS, ToolCall

__all__ = ["LLMCallError", "LLMClient"]

log = logging.getLogger("deckhands.reasoner.llm")

# litellm would fetch its cost map from the internet at import time; use the bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# OpenAI-compatible local servers ignore the key, but litellm's OpenAI client insists on one.
_PLACEHOLDER_KEY = "no-key"


class LLMCallError(Exception):
    """The LLM could not be reached or failed, after litellm's own retries."""


def _litellm() -> Any:
    # Imported on first use: it takes seconds, and building the app must stay cheap.
    import litellm

    litellm.suppress_debug_info = True
    return litellm


class LLMClient:
    def __init__(self, settings: ReasonerSettings) -> None:
        self.settings = settings
        self.model = settings.llm_model
        self._native: bool | None = None

    def _decide_native(self) -> bool:
        choice = self.settings.llm_native_tool_calling
        if choice != "auto":
            return choice == "true"
        litellm = _litellm()
        try:
            litellm.get_model_info(self.model)
        except Exception:
            # Not in litellm's map: an OpenAI-compatible server (llama.cpp, vLLM, the scripted
            # server...). They accept `tools`, and a call written as text is still understood.
            return True
        try:
            return bool(litellm.supports_function_calling(model=self.model))
        except Exception:
            return True

    async def prepare(self) -> None:
        """Import litellm and settle the tool-calling mode, at start-up rather than mid-step."""
        self._native = await asyncio.to_thread(self._decide_native)
        log.info(
            "LLM %s at %s, %s tool calling", self.model, self.settings.llm_api_base or "(provider)",
            "native" if self._native else "prompt-based",
        )

    @property
    def native(self) -> bool:
        if self._native is None:
            self._native = self._decide_native()
        return self._native

    def _request(self, messages: list[dict[str, Any]], native: bool) -> dict[str, Any]:
        s = self.settings
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": s.llm_temperature,
            "timeout": s.llm_timeout_s,
            "num_retries": s.llm_num_retries,
            "drop_params": True,  # a provider that lacks an option ignores it instead of failing
        }
        if s.llm_api_base:
            kwargs["api_base"] = s.llm_api_base
        if s.llm_api_key is not None:
            kwargs["api_key"] = s.llm_api_key.get_secret_value()
        elif s.llm_api_base:
            kwargs["api_key"] = _PLACEHOLDER_KEY
        if s.llm_max_output_tokens:
            kwargs["max_tokens"] = s.llm_max_output_tokens
        if native:
            kwargs["tools"] = TOOL_SPECS
            kwargs["tool_choice"] = s.llm_tool_choice
        return kwargs

    async def complete(self, messages: list[dict[str, Any]], *, native: bool) -> LLMReply:
        litellm = _litellm()
        started = time.perf_counter()
        try:
            response = await litellm.acompletion(**self._request(messages, native))
        except Exception as exc:
            LLM_CALLS.labels(self.model, type(exc).__name__).inc()
            raise LLMCallError(f"{type(exc).__name__}: {exc}") from exc
        latency = time.perf_counter() - started
        LLM_LATENCY.labels(self.model).observe(latency)
        LLM_CALLS.labels(self.model, "ok").inc()
        return self._reply(litellm, response, latency)

    def _reply(self, litellm: Any, response: Any, latency_s: float) -> LLMReply:
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
        try:
            cost = float(litellm.completion_cost(completion_response=response) or 0.0)
        except Exception:
            cost = 0.0  # a model litellm has no price for (local servers): free as far as we know
        LLM_PROMPT_TOKENS.labels(self.model).inc(prompt_tokens)
        LLM_COMPLETION_TOKENS.labels(self.model).inc(completion_tokens)
        LLM_COST.labels(self.model).inc(cost)
        return LLMReply(
            content=str(getattr(message, "content", None) or ""),
            tool_calls=calls,
            usage=LLMUsage(
                model=self.model,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cost_usd=cost,
                latency_ms=round(latency_s * 1000, 1),
            ),
        )
