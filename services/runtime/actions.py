"""Running one runnable action through a sandbox's executor, and the observation it yields."""

from __future__ import annotations

import uuid
from typing import Any

from shared.events import (
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    EventBase,
    EventSource,
    FileEditAction,
    FileEditObservation,
    FileReadAction,
    FileReadObservation,
    FileWriteAction,
    FileWriteObservation,
    PythonOutputObservation,
    RunnableAction,
    RunPythonAction,
)

from .containers import Sandbox
from .executor_client import ExecutorError
from .settings import RuntimeSettings

__all__ = ["RuntimeObservation", "error_observation", "observation_id", "run_action"]

RuntimeObservation = (
    CmdOutputObservation
    | PythonOutputObservation
    | FileReadObservation
    | FileWriteObservation
    | FileEditObservation
    | ErrorObservation
)

# Observation ids derive from the action id: a re-run (should one ever happen) publishes the
# same id, which JetStream's Nats-Msg-Id de-duplication and the controller both recognise.
_OBSERVATION_NS = uuid.UUID("6f3b0a52-39a4-4c1e-9a52-5d3f3c8a7e10")

# The executor enforces the action's timeout; this margin covers escalation (Ctrl-C, kill).
_GRACE_S = 15.0


def observation_id(action_id: str) -> str:
    return uuid.uuid5(_OBSERVATION_NS, action_id).hex


def _answer_fields(action: EventBase) -> dict[str, Any]:
    return {
        "id": observation_id(action.id),
        "task_id": action.task_id,
        "source": EventSource.ENVIRONMENT,
        "cause": action.id,
    }


def error_observation(action: EventBase, content: str, error_code: str) -> ErrorObservation:
    return ErrorObservation(**_answer_fields(action), content=content, error_code=error_code)


def _with_note(output: str, note: str) -> str:
    if not note:
        return output
    if output and not output.endswith("\n"):
        output += "\n"
    return output + note


async def run_action(
    sandbox: Sandbox, action: RunnableAction, settings: RuntimeSettings
) -> RuntimeObservation:
    """Run the action; executor-reported failures become an ErrorObservation.

    SandboxLost and TimeoutError propagate: the caller decides what a dead sandbox means.
    """
    limit = settings.output_limit
    fields = _answer_fields(action)
    try:
        if isinstance(action, CmdRunAction):
            timeout_s = action.timeout_s or settings.action_timeout_s
            request: dict[str, Any] = {
                "command": action.command, "timeout_s": timeout_s, "limit": limit,
                "is_input": action.is_input,
            }
            quiet = action.no_output_timeout_s or settings.no_output_timeout_s
            if quiet:
                request["no_output_timeout_s"] = quiet
            answer = await sandbox.client.request("bash", timeout_s + _GRACE_S, **request)
            return CmdOutputObservation(
                **fields, command=action.command,
                content=_with_note(answer.get("output", ""), answer.get("note", "")),
                exit_code=int(answer.get("exit_code", -1)), cwd=str(answer.get("cwd", "")),
                timed_out=bool(answer.get("timed_out")),
            )
        if isinstance(action, RunPythonAction):
            timeout_s = action.timeout_s or settings.action_timeout_s
            answer = await sandbox.client.request(
                "python", timeout_s + _GRACE_S, code=action.code, timeout_s=timeout_s, limit=limit
            )
            return PythonOutputObservation(
                **fields, content=_with_note(answer.get("output", ""), answer.get("note", "")),
                exit_code=int(answer.get("exit_code", 0)),
            )
        if isinstance(action, FileReadAction):
            answer = await sandbox.client.request(
                "read", 60.0, path=action.path, start_line=action.start_line,
                end_line=action.end_line, limit=limit,
            )
            return FileReadObservation(**fields, path=answer["path"], content=answer["content"])
        if isinstance(action, FileWriteAction):
            answer = await sandbox.client.request(
                "write", 60.0, path=action.path, content=action.content
            )
            return FileWriteObservation(
                **fields, path=answer["path"],
                content=f"Wrote {answer.get('size', 0)} bytes to {answer['path']}",
            )
        if isinstance(action, FileEditAction):
            answer = await sandbox.client.request(
                "edit", 60.0, command=action.command, path=action.path,
                file_text=action.file_text, old_str=action.old_str, new_str=action.new_str,
                insert_line=action.insert_line, view_range=action.view_range, limit=limit,
            )
            return FileEditObservation(
                **fields, path=answer["path"], content=answer.get("content", ""),
                diff=answer.get("diff", ""),
            )
    except ExecutorError as exc:
        return ErrorObservation(**fields, content=str(exc), error_code=exc.code)
    return ErrorObservation(
        **fields, content=f"the runtime cannot run {type(action).__name__}",
        error_code="unsupported_action",
    )
