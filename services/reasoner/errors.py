"""What can go wrong in the reasoner: every exception of its own derives from ReasonerError."""

from __future__ import annotations

__all__ = [
    "BadReply",
    "ContextWindowExceeded",
    "HistoryNotReady",
    "LLMCallError",
    "NoTaskError",
    "ReasonerError",
]


class ReasonerError(Exception):
    """The root of the reasoner's own exceptions: a step it could not answer as asked (the
    history, the LLM or the model's reply failed it)."""


class HistoryNotReady(ReasonerError):
    """Storage could not give the history the step needs; the step is redelivered later."""


class LLMCallError(ReasonerError):
    """The LLM could not be reached or failed, after our retries."""


class ContextWindowExceeded(LLMCallError):
    """The provider refused the prompt as longer than the model's context window."""


class NoTaskError(ReasonerError, ValueError):
    """The history has no user message to start from."""


class BadReply(ReasonerError):
    """The model's reply is not a usable action; the message tells the model what was wrong."""
