"""Settings of the controller."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommonSettings

__all__ = ["ControllerSettings"]


class ControllerSettings(CommonSettings):
    workers: int = Field(
        default=64,
        ge=1,
        description="Events handled concurrently (each is a few Redis and NATS round trips).",
    )
    state_cache_size: int = Field(
        default=1024,
        ge=0,
        description="States this replica saved last, kept so a turn need not read them back "
        "from Redis (the compare-and-set save still rejects a stale one); 0: always read.",
    )
    cas_attempts: int = Field(
        default=20, ge=1, description="Reload-and-retry rounds when another replica wrote first."
    )
    # How long the controller waits for each answer before asking again; after
    # `answer_retries` more tries without an answer the task ends in ERROR naming the service.
    agent_answer_deadline_s: float = Field(
        default=900.0,
        gt=0,
        description="A step: storage, the LLM with its retries; a rate-limit notice restarts it.",
    )
    security_answer_deadline_s: float = Field(default=120.0, gt=0, description="A review.")
    runtime_answer_deadline_s: float = Field(
        default=900.0,
        gt=0,
        description="An action, beyond its own timeout: waiting for a sandbox and starting it.",
    )
    sandbox_queue_deadline_s: float = Field(
        default=3600.0,
        gt=0,
        description="An action queued for a sandbox (every seat taken) waits this long for a "
        "seat before it counts as unanswered (asked again, then ERROR).",
    )
    answer_retries: int = Field(
        default=2, ge=0, description="Times an overdue answer is asked for again before ERROR."
    )
    loop_repeats: int = Field(
        default=3,
        ge=2,
        le=8,
        description="The same action giving the same result this many times, other actions "
        "between, is a loop (issue 29; identical steps in a row are seed 002's patterns).",
    )
    loop_hints: int = Field(
        default=1,
        ge=0,
        le=5,
        description="Hints a looping agent gets (what repeats, a way out) before a loop that "
        "forms again ends its task in ERROR; 0: the first loop ends it, as in OpenHands.",
    )
    deadline_poll_s: float = Field(
        default=2.0, gt=0, description="How often a replica looks for overdue answers."
    )
