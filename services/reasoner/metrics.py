"""Prometheus metrics of the reasoner: LLM tokens, cost, latency, what each step produced, and the
history it read."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "FIRST_STEPS_HELD",
    "FIRST_STEP_SEAT_WAIT",
    "HISTORY_CACHE_BYTES",
    "HISTORY_EVENTS_GIVEN",
    "HISTORY_EVENTS_READ",
    "LLM_CALLS",
    "LLM_CAPACITY_WAIT",
    "LLM_CAPACITY_WAITING",
    "LLM_COMPLETION_TOKENS",
    "LLM_COST",
    "LLM_IN_FLIGHT",
    "LLM_LATENCY",
    "LLM_PAUSES",
    "LLM_PROMPT_TOKENS",
    "LLM_RATE_LIMIT_WAIT",
    "LLM_TOKENS_GRANTED",
    "REASONER_CONDENSATIONS",
    "REASONER_REPLAYED",
    "STEP_ANSWERS",
    "STEP_PHASE",
]

# A task's history, read from storage or given with the step requests (history.py).
HISTORY_EVENTS_READ = Counter(
    "deckhands_reasoner_history_events_read_total", "Events read from storage for prompts"
)
HISTORY_EVENTS_GIVEN = Counter(
    "deckhands_reasoner_history_events_given_total",
    "Log entries that came with step requests (no storage read needed for them)",
)
HISTORY_CACHE_BYTES = Gauge(
    "deckhands_reasoner_history_cache_bytes", "Bytes of task history held for the next steps"
)

LLM_PROMPT_TOKENS = Counter(
    "deckhands_llm_prompt_tokens_total", "Prompt tokens sent to the LLM", ["model"]
)
LLM_COMPLETION_TOKENS = Counter(
    "deckhands_llm_completion_tokens_total", "Completion tokens received from the LLM", ["model"]
)
LLM_COST = Counter(
    "deckhands_llm_cost_usd_total",
    "LLM cost in USD, by litellm's cost map (0 when unknown)",
    ["model"],
)
LLM_IN_FLIGHT = Gauge(
    "deckhands_llm_requests_in_flight",
    "LLM requests on the wire now (at most DECKHANDS_LLM_MAX_CONCURRENCY per replica)",
)
LLM_LATENCY = Histogram(
    "deckhands_llm_latency_seconds",
    "Duration of one successful LLM request",
    ["model"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300),
)
LLM_CALLS = Counter(
    "deckhands_llm_calls_total",
    "LLM calls by outcome ('ok' or the error's type)",
    ["model", "outcome"],
)
STEP_ANSWERS = Counter(
    "deckhands_reasoner_answers_total",
    "Events the reasoner answered steps with, by kind",
    ["kind"],
)
LLM_RATE_LIMIT_WAIT = Counter(
    "deckhands_llm_rate_limit_wait_seconds_total",
    "Time spent waiting out LLM rate limits",
    ["model"],
)
REASONER_CONDENSATIONS = Counter(
    "deckhands_reasoner_condensations_total",
    "Steps answered with a CondensationAction, by trigger ('budget' or 'context_window')",
    ["trigger"],
)
REASONER_REPLAYED = Counter(
    "deckhands_reasoner_replayed_actions_total", "Steps answered from a stored trajectory"
)
LLM_CAPACITY_WAIT = Histogram(
    "deckhands_llm_capacity_wait_seconds",
    "Per model and tenant: how long a call waited for the model's shared capacity (its limits "
    "across every reasoner replica, a provider's pause, other tenants' turns)",
    ["model", "tenant"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
LLM_CAPACITY_WAITING = Gauge(
    "deckhands_llm_capacity_waiting",
    "Per model and tenant: calls of this replica waiting for the model's capacity now",
    ["model", "tenant"],
)
LLM_TOKENS_GRANTED = Counter(
    "deckhands_llm_tokens_granted_total",
    "Per model and tenant: tokens of the calls granted, as the provider counted them (the "
    "estimate when it did not say), counted when the call ends",
    ["model", "tenant"],
)
LLM_PAUSES = Counter(
    "deckhands_llm_pauses_total",
    "A provider's 429 paused the model for the whole deployment",
    ["model"],
)

STEP_PHASE = Histogram(
    "deckhands_reasoner_step_phase_seconds",
    "Where a step's time goes once its request is handled: reading the task's log (history: "
    "storage behind, or not asked), the LLM call (llm: capacity wait included) and sending the "
    "answer on (publish); the wait before handling is deckhands_consumer_wait_seconds",
    ["phase"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

# A queued task's first LLM call waits for its seat (seat_wait.py).
FIRST_STEPS_HELD = Counter(
    "deckhands_reasoner_first_steps_held_total",
    "First steps of tasks queued for a sandbox seat, by how their wait ended: seated, "
    "timed_out (DECKHANDS_FIRST_STEP_SEAT_WAIT_S), not_held_replica_full (half the replica's "
    "step workers already waited)",
    ["outcome"],
)
FIRST_STEP_SEAT_WAIT = Histogram(
    "deckhands_reasoner_first_step_seat_wait_seconds",
    "How long a queued task's first step waited for its seat before asking the LLM",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
