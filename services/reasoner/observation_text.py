"""How an observation reads in the prompt: its output clipped to a limit, with its exit code
and what to do next after a failure, said plainly for small models."""

from __future__ import annotations

import json

from shared.events import (
    AgentDelegateObservation,
    CmdOutputObservation,
    ErrorObservation,
    FileEditObservation,
    FileReadObservation,
    FileWriteObservation,
    MCPCallObservation,
    PythonOutputObservation,
    UserRejectObservation,
)

__all__ = ["lines_written", "observation_text"]

# What to do next after a failed action, by its error_code. The 1.5B model, shown only that
# old_str was not found, sent the same edit again (a number from the test's output) until its
# iterations ran out, never reading the file.
_ERROR_HINTS = {
    "no_match": "Read the file first (read_file), then copy old_str from it exactly, "
    "indentation included.",
    "multiple_matches": "Make old_str longer, with the lines around it, so it occurs once.",
}


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-tail:]}"


def _printed(output: str, limit: int) -> str:
    """What a command printed; said outright when it printed nothing, since a bare exit code
    reads to a small model as if the output were missing."""
    return _clip(output, limit).rstrip() or "(no output)"


def lines_written(content: str) -> str:
    """How many lines a write made, as `wc -l` and a person would each count them: a last line
    without its newline is a line to a person and none to wc, and models report wc's count."""
    if not content:
        return " (empty)"
    newlines = content.count("\n")
    if content.endswith("\n"):
        return f" ({_count(newlines, 'line')})"
    return (
        f" ({_count(newlines + 1, 'line')}; the last has no newline at its end, so wc -l "
        f"counts {newlines})"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def observation_text(obs: object, limit: int) -> str:
    if isinstance(obs, CmdOutputObservation):
        status = f"[exit code {obs.exit_code}, cwd {obs.cwd}"
        status += ", timed out]" if obs.timed_out else "]"
        return f"{_printed(obs.content, limit)}\n{status}"
    if isinstance(obs, PythonOutputObservation):
        return f"{_printed(obs.content, limit)}\n[exit code {obs.exit_code}]"
    if isinstance(obs, FileReadObservation):
        return _clip(obs.content, limit)
    if isinstance(obs, FileWriteObservation):
        return obs.content or f"Wrote {obs.path}."
    if isinstance(obs, FileEditObservation):
        return _clip(f"{obs.content}\n{obs.diff}".strip(), limit)
    if isinstance(obs, ErrorObservation):
        hint = _ERROR_HINTS.get(obs.error_code or "")
        if "Copy old_str exactly" in obs.content:
            hint = None  # the sandbox already showed the lines old_str most likely meant
        return f"ERROR: {_clip(obs.content, limit)}" + (f"\n{hint}" if hint else "")
    if isinstance(obs, MCPCallObservation):
        text = _clip(obs.content, limit)
        return f"ERROR (from the tool): {text}" if obs.is_error else text
    if isinstance(obs, UserRejectObservation):
        return f"REJECTED: {obs.content}"
    if isinstance(obs, AgentDelegateObservation):
        text = f"The helper's task ended in state {obs.agent_state.value}."
        if obs.content:
            text += f"\n{_clip(obs.content, limit)}"
        if obs.outputs:
            text += f"\nOutputs: {_clip(json.dumps(obs.outputs), limit)}"
        return text
    return _clip(str(getattr(obs, "content", "")), limit)
