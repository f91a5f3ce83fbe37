"""The one place that talks to the LLM, through litellm, whatever the provider.

Retries are ours, not litellm's (litellm and the OpenAI SDK it uses are told not to retry), so
that each kind of failure is handled its own way:
- a rate limit is waited out, honouring the provider's Retry-After, for up to
  `llm_rate_limit_max_wait_s`; before each wait the caller is told (the task shows RATE_LIMITED).
  With Redis, the 429 pauses the model for every replica (services/reasoner/capacity.py), and
  a fallback model that is not paused is asked meanwhile;
- a timeout, a connection error or a 5xx is retried `llm_num_retries` times with backoff, then
  the next fallback model is asked, if any;
- a context window overflow raises ContextWindowExceeded at once: the condenser takes over;
- anything else, or a failure that outlasts its retries, raises LLMCallError, and the step goes
  back to JetStream for redelivery.

A failure's kind and the provider's Retry-After are read by llm_failures.py; a reply's content,
tokens and price by llm_usage.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from shared.admission import NO_TENANT
from shared.events import TaskPriority
from shared.fair_slots import FairSlots

from .capacity import CapacityGate, CapacityWait, Lease
from .errors import ContextWindowExceeded, LLMCallError
from .llm_failures import failure_kind, retry_after_s
from .llm_usage import register_unpriced_model, reply_of, tokens_used
from .metrics import LLM_CALLS, LLM_IN_FLIGHT, LLM_LATENCY, LLM_RATE_LIMIT_WAIT
from .replies import LLMReply
from .settings import ReasonerSettings
from .tools import TOOL_SPECS
from .warm_up import speaks_openai, warm_up

__all__ = ["LLMClient", "RateLimitNotice", "retry_after_s"]

log = logging.getLogger("deckhands.reasoner.llm")

# litellm would fetch its cost map from the internet at import time; use the bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# OpenAI-compatible local servers ignore the key, but litellm's OpenAI client insists on one.
_PLACEHOLDER_KEY = "no-key"


# Called before each wait on a rate limit with the attempt number (1, 2...), the wait in s and
# why; attempt 0: the call waits for the model's shared capacity (its limits, other tenants).
RateLimitNotice = Callable[[int, float, str], Awaitable[None]]


@dataclass(frozen=True)
class _Route:
    """A model of the chain and where to reach it."""

    model: str
    api_base: str | None
    api_key: str | None


# Read once, when litellm is first imported (here or by the condenser): litellm copies every
# prompt after each call to shorten base64 images for its logs. We keep no litellm logs, and
# the copy was about 4% of the reasoner's CPU per step (profiled).
os.environ.setdefault("MAX_BASE64_LENGTH_FOR_LOGGING", "0")


def _litellm() -> Any:
    # Imported on first use: it takes seconds, and building the app must stay cheap.
    import litellm

    litellm.suppress_debug_info = True
    return litellm


class LLMClient:
    def __init__(self, settings: ReasonerSettings) -> None:
        self.settings = settings
        self.model = settings.llm_model
        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
        self.routes = [
            _Route(settings.llm_model, settings.llm_api_base, key),
            *(
                _Route(
                    f.model, f.api_base, os.environ.get(f.api_key_env) if f.api_key_env else None
                )
                for f in settings.llm_fallback_models
            ),
        ]
        self._gates: dict[str, CapacityGate] = {}
        self._native: bool | None = None
        # What is scarce is the provider's concurrency, not the steps waiting on it: a step
        # holds one of these only while its request is on the wire, never while it backs off.
        # Handed out fairly: a tenant's batch of hundreds of calls does not hold another
        # tenant's call (or its own interactive one) back for more than the next free slot.
        self._in_flight = FairSlots(settings.llm_max_concurrency)
        # The model's series exist from the start: a rate needs a sample from before the first
        # call, or the first minute of calls shows no rate at all.
        LLM_LATENCY.labels(self.model)
        LLM_CALLS.labels(self.model, "ok")
        # litellm reads this switch on every call; it sends `openai/` models (and any model
        # with an API base on the OpenAI route) through its own HTTP handler rather than the
        # OpenAI SDK (see llm_openai_sdk).
        os.environ["EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER"] = (
            "false" if settings.llm_openai_sdk else "true"
        )

    def attach(self, redis: Redis) -> None:
        """Share each model's capacity with the other replicas through Redis (without it, each
        replica only bounds its own calls)."""
        ttl_s = self.settings.llm_timeout_s + 30
        self._gates = {
            route.model: CapacityGate(
                redis, route.model, self.settings.llm_capacity.get(route.model), ttl_s
            )
            for route in self.routes
        }

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
        """Import litellm, settle the tool-calling mode and warm the client up, at start-up
        rather than during the first steps."""
        self._native = await asyncio.to_thread(self._decide_native)
        for route in self.routes:
            register_unpriced_model(self.settings, _litellm(), route.model, self._native)
        log.info(
            "LLM %s at %s, %s tool calling",
            self.model,
            self.settings.llm_api_base or "(provider)",
            "native" if self._native else "prompt-based",
        )
        if speaks_openai(self.model, self.settings.llm_api_base):
            spent = await warm_up(_litellm(), self._request(self.routes[0], [], self._native))
            log.info("LLM client warmed up in %.1fs", spent)

    @property
    def native(self) -> bool:
        if self._native is None:
            self._native = self._decide_native()
        return self._native

    def _request(
        self, route: _Route, messages: list[dict[str, Any]], native: bool
    ) -> dict[str, Any]:
        s = self.settings
        kwargs: dict[str, Any] = {
            "model": route.model,
            "messages": messages,
            "temperature": s.llm_temperature,
            "timeout": s.llm_timeout_s,
            # No retries inside litellm or the OpenAI SDK: `complete` retries each kind of
            # failure its own way (a hidden wait on a rate limit would not show RATE_LIMITED).
            "num_retries": 0,
            "max_retries": 0,
            "drop_params": True,  # a provider that lacks an option ignores it instead of failing
        }
        if route.api_base:
            kwargs["api_base"] = route.api_base
        if route.api_key is not None:
            kwargs["api_key"] = route.api_key
        elif route.api_base:
            kwargs["api_key"] = _PLACEHOLDER_KEY
        if s.llm_max_output_tokens:
            kwargs["max_tokens"] = s.llm_max_output_tokens
        if native:
            kwargs["tools"] = TOOL_SPECS
            kwargs["tool_choice"] = s.llm_tool_choice
        return kwargs

    def _backoff(self, attempt: int, exc: BaseException) -> float:
        s = self.settings
        wait = s.llm_retry_backoff_s * 2.0 ** (attempt - 1)
        asked = retry_after_s(exc)
        if asked is not None:
            # Never sooner than the provider asks; never a busy loop on "Retry-After: 0".
            wait = max(asked, s.llm_retry_backoff_s)
        return min(wait, s.llm_retry_backoff_max_s)

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        native: bool,
        on_rate_limit: RateLimitNotice | None = None,
        tenant_id: str | None = None,
        priority: TaskPriority = TaskPriority.INTERACTIVE,
    ) -> LLMReply:
        s = self.settings
        litellm = _litellm()
        failures: dict[str, int] = {}
        down: set[str] = set()  # failed after their retries, for this call
        rate_limits = 0
        waited_s = 0.0
        problem = ""
        while True:
            route = await self._pick(down)
            if route is None:
                raise LLMCallError(problem)
            started = time.perf_counter()
            try:
                response = await self._send(
                    litellm, route, messages, native, tenant_id, priority, on_rate_limit
                )
            except Exception as exc:
                LLM_CALLS.labels(route.model, type(exc).__name__).inc()
                kind = failure_kind(litellm, exc)
                problem = f"{type(exc).__name__}: {exc}"
                if kind == "context_window":
                    raise ContextWindowExceeded(problem) from exc
                if kind == "rate_limit":
                    rate_limits += 1
                    wait = self._backoff(rate_limits, exc)
                    gate = self._gates.get(route.model)
                    if gate is not None:
                        await gate.pause(wait)  # every replica waits, not only this call
                        if await self._pick(down, skip_paused_only=True) is not None:
                            continue  # a fallback that is not paused: ask it now
                    if waited_s + wait > s.llm_rate_limit_max_wait_s:
                        raise LLMCallError(
                            f"still rate limited after waiting {waited_s:.0f}s: {problem}"
                        ) from exc
                    log.info("LLM rate limit, attempt %d: retrying in %.1fs", rate_limits, wait)
                    if on_rate_limit is not None:
                        await on_rate_limit(rate_limits, wait, f"LLM rate limit ({route.model})")
                    LLM_RATE_LIMIT_WAIT.labels(route.model).inc(wait)
                    if gate is None:
                        await asyncio.sleep(wait)  # else the lease waits for the pause's end
                    waited_s += wait
                    continue
                if kind == "transient" and failures.get(route.model, 0) < s.llm_num_retries:
                    failures[route.model] = failures.get(route.model, 0) + 1
                    wait = self._backoff(failures[route.model], exc)
                    log.info(
                        "LLM call failed (%s), retry %d in %.1fs",
                        problem,
                        failures[route.model],
                        wait,
                    )
                    await asyncio.sleep(wait)
                    continue
                if kind == "transient":
                    down.add(route.model)
                    if len(down) < len(self.routes):
                        log.warning(
                            "LLM %s is down (%s): trying the next model", route.model, problem
                        )
                        continue
                raise LLMCallError(problem) from exc
            latency = time.perf_counter() - started
            LLM_LATENCY.labels(route.model).observe(latency)
            LLM_CALLS.labels(route.model, "ok").inc()
            return reply_of(self.settings, litellm, response, latency, route.model)

    async def _send(
        self,
        litellm: Any,
        route: _Route,
        messages: list[dict[str, Any]],
        native: bool,
        tenant_id: str | None,
        priority: TaskPriority,
        on_rate_limit: RateLimitNotice | None,
    ) -> Any:
        """The request on the wire, within the model's shared capacity (its lease) and a slot of
        this replica's concurrency; the provider's response."""
        async with self._lease(route, messages, tenant_id, priority, on_rate_limit) as lease:
            async with self._in_flight.slot(tenant_id or NO_TENANT, priority):
                LLM_IN_FLIGHT.inc()
                try:
                    response = await litellm.acompletion(**self._request(route, messages, native))
                finally:
                    LLM_IN_FLIGHT.dec()
            if lease is not None:
                lease.used_tokens = tokens_used(response)
        return response

    async def _pick(self, down: set[str], *, skip_paused_only: bool = False) -> _Route | None:
        """The first model of the chain that is neither down nor paused; when every one left is
        paused, the first (its lease waits for the pause to end); None when all are down. With
        `skip_paused_only`: only a model that is not paused, else None."""
        candidates = [r for r in self.routes if r.model not in down]
        if not candidates:
            return None
        if len(candidates) == 1 and not skip_paused_only:
            return candidates[0]  # no choice to make: no need to ask Redis
        for route in candidates:
            gate = self._gates.get(route.model)
            if gate is None or await gate.paused_for() <= 0:
                return route
        return None if skip_paused_only else candidates[0]

    @contextlib.asynccontextmanager
    async def _lease(
        self,
        route: _Route,
        messages: list[dict[str, Any]],
        tenant_id: str | None,
        priority: TaskPriority,
        on_rate_limit: RateLimitNotice | None,
    ) -> AsyncIterator[Lease | None]:
        """Room for one call in the model's shared capacity (none without Redis)."""
        gate = self._gates.get(route.model)
        if gate is None:
            yield None
            return
        estimate = 0
        if gate.limits.tokens_per_minute is not None:
            # About four characters a token, and the completion at its most.
            estimate = len(json.dumps(messages)) // 4 + (
                self.settings.llm_max_output_tokens or 1024
            )

        async def noticed(wait: CapacityWait) -> None:
            if on_rate_limit is not None:
                await on_rate_limit(
                    0, wait.wait_s, f"waiting for LLM capacity ({route.model}: {wait.why})"
                )

        async with gate.lease(
            tenant_id, estimate, noticed, self.settings.llm_capacity_notice_s, priority
        ) as lease:
            yield lease
