"""Running one runnable action through a sandbox's executor, and the observation it yields."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from shared.blobs import BlobMissing, BlobStore
from shared.events import (
    BlobRef,
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
    MCPCallObservation,
    PythonOutputObservation,
    RunnableAction,
    RunPythonAction,
)
from shared.secret_redaction import Redactor

from .containers import Sandbox
from .errors import ExecutorError, SandboxLost
from .settings import RuntimeSettings
from .task_secrets import exported

__all__ = [
    "RuntimeObservation",
    "error_observation",
    "observation_id",
    "run_action",
]

log = logging.getLogger("deckhands.runtime.actions")

RuntimeObservation = (
    CmdOutputObservation
    | PythonOutputObservation
    | FileReadObservation
    | FileWriteObservation
    | FileEditObservation
    | ErrorObservation
    | MCPCallObservation
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


async def _content_of(action: FileWriteAction, blobs: BlobStore | None) -> str:
    """The content a write refers to (its claim check), from the blob store."""
    ref = action.content_ref
    assert ref is not None
    missing = BlobMissing(
        f"the content of this write ({ref.size:,} bytes, blob {ref.sha256}) is not in the "
        "blob store, so nothing was written; write the file again"
    )
    if blobs is None:
        raise missing
    try:
        return (await blobs.get(action.task_id, ref.sha256)).decode("utf-8", "replace")
    except BlobMissing:
        raise missing from None


def _notes(*notes: str) -> str:
    return "\n".join(n for n in notes if n)


async def _kept(
    sandbox: Sandbox,
    action: EventBase,
    answer: dict[str, Any],
    blobs: BlobStore | None,
    redactor: Redactor | None = None,
) -> tuple[BlobRef | None, str]:
    """Fetch the whole output the executor kept (in pieces) into the blob store.

    Returns its claim check, or None and a note saying why it could not be kept; a failure
    here never fails the action, whose cut output is already in hand.
    """
    name = answer.get("kept")
    if not name or blobs is None:
        return None, ""
    pieces: list[bytes] = []
    offset = 0
    try:
        while True:
            piece = await sandbox.client.request("chunk", 30.0, name=name, offset=offset, drop=True)
            pieces.append(str(piece.get("data", "")).encode())
            offset = int(piece["next"])
            if piece.get("eof"):
                break
        whole = b"".join(pieces)
        if redactor:
            whole = redactor.data(whole)  # the task's secret values never reach the store
        return await blobs.put(action.task_id, whole), ""
    except (ExecutorError, SandboxLost, KeyError, ValueError, TimeoutError, OSError) as exc:
        log.warning("task %s: whole output not kept: %s", action.task_id, exc)
        return None, f"[the whole output could not be kept: {exc}]"
    except Exception as exc:  # the blob store (NATS) refused it: full, or unreachable
        log.warning("task %s: whole output not kept: %s", action.task_id, exc)
        return None, f"[the whole output could not be kept: {type(exc).__name__}]"


async def run_action(
    sandbox: Sandbox,
    action: RunnableAction,
    settings: RuntimeSettings,
    blobs: BlobStore | None = None,
    secrets: Mapping[str, str] | None = None,
) -> RuntimeObservation:
    """Run the action; executor-reported failures become an ErrorObservation.

    With `blobs`, output longer than output_limit is also kept whole (up to output_keep_bytes)
    in the blob store, and the observation carries its claim check (`content_ref`).
    SandboxLost and TimeoutError propagate: the caller decides what a dead sandbox means.
    With `secrets` ({name: value}, the task's), a command or cell runs with them in its
    environment (the executor's `env`, never in the command: see task_secrets.py) and a kept
    whole output has them redacted (the caller redacts the observation).
    """
    limit = settings.output_limit
    whole = settings.output_keep_bytes if blobs is not None else 0
    fields = _answer_fields(action)
    redactor = Redactor(secrets or {})
    env = exported(secrets or {})
    try:
        if isinstance(action, CmdRunAction):
            timeout_s = action.timeout_s or settings.action_timeout_s
            request: dict[str, Any] = {
                "command": action.command,
                "timeout_s": timeout_s,
                "limit": limit,
                "is_input": action.is_input,
                "keep": whole,
            }
            if env and not action.is_input:  # input goes to a running program as it is
                request["env"] = env
            quiet = action.no_output_timeout_s or settings.no_output_timeout_s
            if quiet:
                request["no_output_timeout_s"] = quiet
            answer = await sandbox.client.request("bash", timeout_s + _GRACE_S, **request)
            ref, missed = await _kept(sandbox, action, answer, blobs, redactor)
            return CmdOutputObservation(
                **fields,
                command=action.command,
                content_ref=ref,
                content=_with_note(
                    answer.get("output", ""), _notes(answer.get("note", ""), missed)
                ),
                exit_code=int(answer.get("exit_code", -1)),
                cwd=str(answer.get("cwd", "")),
                timed_out=bool(answer.get("timed_out")),
            )
        if isinstance(action, RunPythonAction):
            timeout_s = action.timeout_s or settings.action_timeout_s
            cell: dict[str, Any] = {"env": env} if env else {}
            answer = await sandbox.client.request(
                "python",
                timeout_s + _GRACE_S,
                code=action.code,
                timeout_s=timeout_s,
                limit=limit,
                keep=whole,
                **cell,
            )
            ref, missed = await _kept(sandbox, action, answer, blobs, redactor)
            return PythonOutputObservation(
                **fields,
                content_ref=ref,
                content=_with_note(
                    answer.get("output", ""), _notes(answer.get("note", ""), missed)
                ),
                exit_code=int(answer.get("exit_code", 0)),
            )
        if isinstance(action, FileReadAction):
            answer = await sandbox.client.request(
                "read",
                60.0,
                path=action.path,
                start_line=action.start_line,
                end_line=action.end_line,
                limit=limit,
                keep=whole,
            )
            ref, missed = await _kept(sandbox, action, answer, blobs, redactor)
            return FileReadObservation(
                **fields,
                path=answer["path"],
                content=_with_note(answer["content"], missed),
                content_ref=ref,
            )
        if isinstance(action, FileWriteAction):
            content = action.content
            if action.content_ref is not None:
                try:
                    content = await _content_of(action, blobs)
                except BlobMissing as exc:
                    return ErrorObservation(**fields, content=str(exc), error_code="not_found")
            answer = await sandbox.client.request("write", 60.0, path=action.path, content=content)
            return FileWriteObservation(
                **fields,
                path=answer["path"],
                content=f"Wrote {answer.get('size', 0)} bytes to {answer['path']}",
            )
        if isinstance(action, FileEditAction):
            answer = await sandbox.client.request(
                "edit",
                60.0,
                command=action.command,
                path=action.path,
                file_text=action.file_text,
                old_str=action.old_str,
                new_str=action.new_str,
                insert_line=action.insert_line,
                view_range=action.view_range,
                limit=limit,
            )
            return FileEditObservation(
                **fields,
                path=answer["path"],
                content=answer.get("content", ""),
                diff=answer.get("diff", ""),
            )
    except ExecutorError as exc:
        return ErrorObservation(**fields, content=str(exc), error_code=exc.code)
    return ErrorObservation(
        **fields,
        content=f"the runtime cannot run {type(action).__name__}",
        error_code="unsupported_action",
    )
