"""The condenser (seed 002): keeps a long task's prompt inside the model's context window.

When the prompt would exceed the budget (DECKHANDS_LLM_MAX_INPUT_TOKENS), or the provider says
it did (a context window error), the reasoner answers the step with a CondensationAction instead
of calling the LLM: the steps up to `forgotten_up_to_seq` leave the prompt, and `summary` stands
for them. The system prompt and the task are always kept, and so are the most recent steps.

The summary is deterministic (no LLM call): one line per condensed step with its outcome, e.g.
"ran `python3 squares.py` -> exit 0, 231 chars of output", the newest lines kept when they do
not all fit its size bound. Each condensation cuts deep enough to bring the prompt well under
the budget (a fraction of it), so the following steps can grow the prompt again for a while.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from shared.events import (
    AgentDelegateAction,
    AgentDelegateObservation,
    AgentFinishAction,
    AgentThinkAction,
    ChangeAgentStateAction,
    CmdOutputObservation,
    CmdRunAction,
    CondensationAction,
    ErrorObservation,
    EventSource,
    FileReadAction,
    FileReadObservation,
    FileWriteAction,
    FileWriteObservation,
    MessageAction,
    PythonOutputObservation,
    RunPythonAction,
    UserRejectObservation,
)

from .prompt import BAD_REPLY_ERROR, LLM_ERROR, PromptView, answers_by_action
from .tools import TOOL_SPECS

__all__ = [
    "Condensation",
    "TokenCounter",
    "count_prompt",
    "plan_condensation",
    "summarize",
    "summary_lines",
]

log = logging.getLogger("deckhands.reasoner.condenser")

_LINE_CHARS = 300
_OMITTED = "- ({n} earlier steps not shown)"


class TokenCounter:
    """Tokens of messages for one model: litellm's tokenizer for it, characters / 4 failing that.

    Counting is CPU work (run it off the event loop); each chunk of the prompt is counted on
    its own, so a sum slightly over-counts, which errs on the safe side.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self._tools: int | None = None

    def messages(self, messages: Sequence[dict[str, Any]]) -> int:
        if not messages:
            return 0
        try:
            import litellm

            return int(litellm.token_counter(model=self.model, messages=list(messages)))
        except Exception:
            return sum(len(json.dumps(m)) for m in messages) // 4 + 1

    def text(self, text: str) -> int:
        try:
            import litellm

            return int(litellm.token_counter(model=self.model, text=text))
        except Exception:
            return len(text) // 4 + 1

    def tools(self) -> int:
        """The tool definitions sent with a native-tool-calling request."""
        if self._tools is None:
            self._tools = self.text(json.dumps(TOOL_SPECS))
        return self._tools


def count_prompt(view: PromptView, counter: TokenCounter, *, native: bool) -> int:
    return counter.messages(view.messages()) + (counter.tools() if native else 0)


@dataclass(frozen=True)
class Condensation:
    forgotten_up_to_seq: int
    summary: str
    tokens_before: int
    tokens_after: int


# --- the summary -----------------------------------------------------------------------------


def _short(text: str, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _tail(text: str, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else "…" + flat[-(limit - 1) :]


def _outcome(obs: Any) -> str:
    if obs is None:
        return "no result"
    if isinstance(obs, CmdOutputObservation | PythonOutputObservation):
        text = f"exit {obs.exit_code}"
        if getattr(obs, "timed_out", False):
            text += ", timed out"
        if not obs.content.strip():
            return text + ", no output"
        # The end of an output is where errors and results usually are.
        return f'{text}, {len(obs.content)} chars of output ending "{_tail(obs.content, 80)}"'
    if isinstance(obs, FileReadObservation):
        return f"{len(obs.content)} chars"
    if isinstance(obs, FileWriteObservation):
        return "written"
    if isinstance(obs, ErrorObservation):
        return f"error: {_short(obs.content, 120)}"
    if isinstance(obs, UserRejectObservation):
        return "rejected by the user"
    if isinstance(obs, AgentDelegateObservation):
        return f"the helper ended {obs.agent_state.value}: {_short(obs.content, 120)}"
    content = getattr(obs, "content", "")
    return f"{obs.kind}: {_short(content, 120)}" if content else str(obs.kind)


def _describe_action(event: Any) -> str:
    if isinstance(event, CmdRunAction):
        return f"ran `{_short(event.command, 120)}`"
    if isinstance(event, RunPythonAction):
        lines = event.code.strip().splitlines() or [""]
        return f"ran Python code ({len(lines)} lines) `{_short(lines[0], 80)}`"
    if isinstance(event, FileReadAction):
        return f"read {event.path}"
    if isinstance(event, FileWriteAction):
        return f"wrote {event.path} ({len(event.content)} chars)"
    if isinstance(event, AgentThinkAction):
        return f"thought: {_short(event.thought, 200)}"
    if isinstance(event, AgentDelegateAction):
        return f"delegated: {_short(event.task, 120)}"
    if isinstance(event, AgentFinishAction):
        return f"finished: {_short(event.final_message, 120)}"
    # An action kind newer than this summary: its kind and its main argument.
    target = getattr(event, "path", None) or getattr(event, "command", None) or ""
    return f"{event.kind} {_short(str(target), 120)}".rstrip()


def _describe(event: Any, answers: dict[str, Any], known_ids: set[str]) -> str | None:
    if isinstance(event, ChangeAgentStateAction | CondensationAction):
        return None
    if isinstance(event, MessageAction):
        if event.source == EventSource.USER:
            return f"the user said: {_short(event.content, 240)}"
        if event.source == EventSource.AGENT:
            return f"you said: {_short(event.content, 200)}"
        return None
    if isinstance(event, ErrorObservation):
        if event.error_code == LLM_ERROR or event.cause in known_ids:
            return None  # not shown in the prompt either (see prompt._render)
        if event.error_code == BAD_REPLY_ERROR:
            return f"your reply was invalid: {_short(event.content, 160)}"
        return f"error: {_short(event.content, 160)}"
    if event.source == EventSource.AGENT and hasattr(event, "tool_call_id"):
        text = _describe_action(event)
        if isinstance(event, AgentThinkAction | AgentFinishAction):
            return text
        return f"{text} -> {_outcome(answers.get(event.id))}"
    return None


def summary_lines(events: Sequence[Any], task_seq: int) -> list[tuple[int, str]]:
    """(seq, line) for each event after the task that a summary should mention, in order."""
    answers = answers_by_action(events)
    known_ids = {e.id for e in events}
    lines = []
    for event in events:
        seq = getattr(event, "seq", None)
        if seq is None or seq <= task_seq:
            continue
        text = _describe(event, answers, known_ids)
        if text is not None:
            lines.append((seq, "- " + _short(text, _LINE_CHARS)))
    return lines


def summarize(lines: Sequence[tuple[int, str]], up_to_seq: int, max_chars: int) -> str:
    """The lines up to `up_to_seq`, newest kept when they do not all fit in `max_chars`."""
    chosen = [text for seq, text in lines if seq <= up_to_seq]
    kept: list[str] = []
    size = 0
    budget = max_chars - len(_OMITTED.format(n=len(chosen))) - 1
    for text in reversed(chosen):
        if size + len(text) + 1 > budget:
            break
        kept.append(text)
        size += len(text) + 1
    kept.reverse()
    dropped = len(chosen) - len(kept)
    if dropped:
        kept.insert(0, _OMITTED.format(n=dropped))
    return "\n".join(kept)


# --- where to cut ----------------------------------------------------------------------------


def plan_condensation(
    view: PromptView,
    lines: Sequence[tuple[int, str]],
    *,
    count: TokenCounter,
    native: bool,
    budget: int,
    target_fraction: float,
    keep_recent: int,
    max_summary_chars: int,
    force: bool = False,
) -> Condensation | None:
    """The condensation the prompt needs now, or None.

    Without `force`, only a prompt over `budget` tokens is condensed. With it (the provider
    refused the prompt as too long), the prompt is at least halved. None also when nothing more
    can be condensed: every step left is among the `keep_recent` newest.
    """
    fixed = count.messages(view.head) + (count.tools() if native else 0)
    current = view.forgotten_up_to_seq
    # Chunks the current condensation hides stay hidden under any deeper cut: never counted,
    # so a step costs what its prompt costs, however long the task has run.
    chunk_tokens = [
        0 if view.forgets(c, current) else count.messages(c.messages) for c in view.chunks
    ]
    # suffix[j]: tokens of the chunks from index j on (what a cut just before chunk j keeps);
    # pinned[j]: tokens of the chunks before j that no cut forgets (none after the task).
    suffix = [*reversed(list(accumulate(reversed(chunk_tokens)))), 0]
    pinned = list(
        accumulate(
            (
                t if c.seq is None or c.seq <= view.task_seq else 0
                for c, t in zip(view.chunks, chunk_tokens, strict=True)
            ),
            initial=0,
        )
    )

    def note_tokens(cut: int, summary: str) -> int:
        note = view.summary_message(cut, summary)
        return count.messages([note]) if note is not None else 0

    now = fixed + note_tokens(current, view.summary) + sum(chunk_tokens)
    if not force and (budget <= 0 or now <= budget):
        return None
    goal = int(budget * target_fraction) if budget > 0 else now // 2
    if force:
        goal = min(goal, now // 2)

    def plan(j: int, cut: int) -> Condensation:
        summary = summarize(lines, cut, max_summary_chars)
        return Condensation(
            cut, summary, now, fixed + pinned[j] + suffix[j] + note_tokens(cut, summary)
        )

    last_allowed = len(view.chunks) - keep_recent
    deepest: tuple[int, int] | None = None
    for j, chunk in enumerate(view.chunks):
        if j > last_allowed:
            break
        if chunk.seq is None or chunk.seq - 1 <= max(current, view.task_seq):
            continue
        cut = chunk.seq - 1  # forget everything before chunk j: no call loses its result
        deepest = (j, cut)
        if fixed + pinned[j] + suffix[j] > goal:
            continue  # too long even before the note that stands for the forgotten steps
        candidate = plan(j, cut)
        if candidate.tokens_after <= goal:
            return candidate
    if deepest is None:
        log.info("prompt of %d tokens is over budget, but nothing more can be condensed", now)
        return None
    # Nothing gets under the goal: forget all that may be forgotten.
    return plan(*deepest)
