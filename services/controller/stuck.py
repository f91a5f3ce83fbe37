"""StuckDetector (seed 002): five patterns that mean the agent is looping, and a sixth (issue
29): the same action giving the same result again and again with other actions between (an
edit, then the same failing run, then another edit...), which no pattern of identical steps
catches.

The controller keeps no history in memory, so the State carries a short list of event
signatures since the last user message; `detect` reads only that list.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass

from shared.events import (
    ACTION_TYPES,
    OBSERVATION_TYPES,
    AgentStateChangedObservation,
    ChangeAgentStateAction,
    ErrorObservation,
    EventBase,
    EventSource,
    MessageAction,
    SecurityVerdictObservation,
)

__all__ = ["SIGNATURES_KEPT", "LoopPolicy", "detect", "signature"]

SIGNATURES_KEPT = 24
# Fields that differ between two otherwise identical events.
_VOLATILE = {"id", "seq", "timestamp", "cause", "tool_call_id", "llm_usage", "thought"}


def _digest(event: EventBase) -> str:
    body = event.model_dump(mode="json", exclude=_VOLATILE)
    return hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LoopPolicy:
    """How soon a loop is one (DECKHANDS_LOOP_REPEATS) and how many hints the agent gets before
    a loop ends its task (DECKHANDS_LOOP_HINTS; 0: at once, as OpenHands does)."""

    repeats: int = 3
    hints: int = 1


def signature(event: EventBase) -> str | None:
    """'A:', 'M:' (agent message), 'O:' or 'E:' (error) plus a digest; None if it doesn't count."""
    if isinstance(event, ChangeAgentStateAction | AgentStateChangedObservation):
        return None
    if getattr(event, "on_agents_behalf", False):
        return None  # not the model's choice
    if isinstance(event, SecurityVerdictObservation):
        return None
    if event.source is EventSource.USER:
        return None
    if isinstance(event, MessageAction):
        return f"M:{_digest(event)}"
    if isinstance(event, ErrorObservation):
        return f"E:{_digest(event)}"
    if event.kind == "condensation":  # type: ignore[attr-defined]
        return "C:"
    if isinstance(event, ACTION_TYPES):
        return f"A:{_digest(event)}"
    if isinstance(event, OBSERVATION_TYPES):
        return f"O:{_digest(event)}"
    return None


def _is_action(sig: str) -> bool:
    return sig[0] in "AM"


def _all_same(items: list[str]) -> bool:
    return len(set(items)) == 1


def detect(signatures: list[str], repeats: int = 3) -> str | None:
    """The name of the first pattern the recent history matches, or None."""
    if len(signatures) < 3:
        return None
    actions = [s for s in signatures if _is_action(s)]
    observations = [s for s in signatures if not _is_action(s) and s != "C:"]

    if len(actions) >= 4 and len(observations) >= 4:
        if _all_same(actions[-4:]) and _all_same(observations[-4:]):
            return "repeating action/observation: the same action and result 4 times"
    if len(actions) >= 3 and len(observations) >= 3:
        if _all_same(actions[-3:]) and all(o.startswith("E:") for o in observations[-3:]):
            return "repeating action/error: the same action failed 3 times"
    tail = signatures[-3:]
    if all(s.startswith("M:") for s in tail) and _all_same(tail):
        return "monologue: the same agent message 3 times with nothing in between"
    if len(actions) >= 6 and len(observations) >= 6:
        a, o = actions[-6:], observations[-6:]
        if a[0::2].count(a[0]) == 3 and a[1::2].count(a[1]) == 3 and a[0] != a[1]:
            if o[0::2].count(o[0]) == 3 and o[1::2].count(o[1]) == 3:
                return "alternating pattern: two action/observation pairs alternating over 6 steps"
    if len(signatures) >= 10 and all(s == "C:" for s in signatures[-10:]):
        return "context window: 10 condensations in a row"
    return _repeating_result(signatures, repeats)


def _repeating_result(signatures: list[str], repeats: int) -> str | None:
    """The same action and result `repeats` times among the last steps, different actions
    between them (identical steps in a row are the patterns above)."""
    pairs: list[tuple[str, str]] = []
    action = None
    for sig in signatures:
        if sig[0] == "A":
            action = sig
        elif sig[0] in "OE" and action is not None:
            pairs.append((action, sig))
            action = None
    window = pairs[-3 * repeats :]
    if len(window) < repeats or len({a for a, _ in window}) < 2:
        return None
    (_, result), times = Counter(window).most_common(1)[0]
    if times < repeats:
        return None
    what = "error" if result.startswith("E:") else "result"
    return (
        f"repeating {what}: the same action gave the same {what} {times} times, "
        "with other actions between"
    )
