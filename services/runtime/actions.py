"""Running one runnable action through a sandbox's executor, and the observation it yields."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from shared.blobs import BlobMissing, BlobStore
from shared.events import (
    ApplyPatchAction,
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
    GlobAction,
    GrepAction,
    MCPCallObservation,
    PythonOutputObservation,
    RunnableAction,
    RunPythonAction,
)
from shared.sandbox_protocol.messages import (
    BashRequest,
    EditRequest,
    PythonRequest,
    ReadRequest,
    WriteReply,
)
from shared.sandbox_protocol.session import SandboxSession
from shared.secret_redaction import Redactor

from .errors import ExecutorError, SandboxLost
from .settings import RuntimeSettings
from .task_secrets import exported
from .tool_commands import glob_command, grep_command, patch_command

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
# How long a file operation may take (they have no timeout of their own).
_FILE_WAIT_S = 60.0
_TOOL_TIMEOUT_S = 120.0  # a glob, a grep or a patch


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
    session: SandboxSession,
    action: EventBase,
    kept: str | None,
    blobs: BlobStore | None,
    redactor: Redactor | None = None,
) -> tuple[BlobRef | None, str]:
    """Fetch the whole output the executor kept (named `kept`, in pieces) into the blob store.

    Returns its claim check, or None and a note saying why it could not be kept; a failure
    here never fails the action, whose cut output is already in hand.
    """
    if not kept or blobs is None:
        return None, ""
    pieces: list[bytes] = []
    offset = 0
    try:
        while True:
            piece = await session.chunk({"name": kept, "offset": offset, "drop": True}, 30.0)
            pieces.append(piece["data"].encode())
            offset = piece["next"]
            if piece["eof"]:
                break
        whole = b"".join(pieces)
        if redactor:
            whole = redactor.data(whole)  # the task's secret values never reach the store
        return await blobs.put(action.task_id, whole), ""
    except (ExecutorError, SandboxLost, TimeoutError, OSError) as exc:
        log.warning("task %s: whole output not kept: %s", action.task_id, exc)
        return None, f"[the whole output could not be kept: {exc}]"
    except Exception as exc:  # the blob store (NATS) refused it: full, or unreachable
        log.warning("task %s: whole output not kept: %s", action.task_id, exc)
        return None, f"[the whole output could not be kept: {type(exc).__name__}]"


class _ActionRun:
    """One action's run: the settings, stores and secrets every kind of action shares."""

    def __init__(
        self,
        session: SandboxSession,
        settings: RuntimeSettings,
        blobs: BlobStore | None,
        secrets: Mapping[str, str],
    ) -> None:
        self.session = session
        self.settings = settings
        self.blobs = blobs
        self.limit = settings.output_limit
        self.keep = settings.output_keep_bytes if blobs is not None else 0
        self.redactor = Redactor(secrets)
        self.env = exported(secrets)

    async def whole(self, action: EventBase, kept: str | None) -> tuple[BlobRef | None, str]:
        return await _kept(self.session, action, kept, self.blobs, self.redactor)

    async def command(self, action: CmdRunAction) -> CmdOutputObservation:
        timeout_s = action.timeout_s or self.settings.action_timeout_s
        request: BashRequest = {
            "command": action.command,
            "timeout_s": timeout_s,
            "limit": self.limit,
            "is_input": action.is_input,
            "keep": self.keep,
        }
        if self.env and not action.is_input:  # input goes to a running program as it is
            request["env"] = self.env
        quiet = action.no_output_timeout_s or self.settings.no_output_timeout_s
        if quiet:
            request["no_output_timeout_s"] = quiet
        answer = await self.session.bash(request, timeout_s + _GRACE_S)
        ref, missed = await self.whole(action, answer.get("kept"))
        return CmdOutputObservation(
            **_answer_fields(action),
            command=action.command,
            content_ref=ref,
            content=_with_note(answer["output"], _notes(answer["note"], missed)),
            exit_code=answer["exit_code"],
            cwd=answer["cwd"],
            timed_out=answer["timed_out"],
        )

    async def cell(self, action: RunPythonAction) -> PythonOutputObservation:
        timeout_s = action.timeout_s or self.settings.action_timeout_s
        request: PythonRequest = {
            "code": action.code,
            "timeout_s": timeout_s,
            "limit": self.limit,
            "keep": self.keep,
        }
        if self.env:
            request["env"] = self.env
        answer = await self.session.python(request, timeout_s + _GRACE_S)
        ref, missed = await self.whole(action, answer.get("kept"))
        return PythonOutputObservation(
            **_answer_fields(action),
            content_ref=ref,
            content=_with_note(answer["output"], _notes(answer["note"], missed)),
            exit_code=answer["exit_code"],
        )

    async def read(self, action: FileReadAction) -> FileReadObservation:
        request: ReadRequest = {
            "path": action.path,
            "start_line": action.start_line,
            "end_line": action.end_line,
            "limit": self.limit,
            "keep": self.keep,
        }
        answer = await self.session.read(request, _FILE_WAIT_S)
        ref, missed = await self.whole(action, answer.get("kept"))
        return FileReadObservation(
            **_answer_fields(action),
            path=answer["path"],
            content=_with_note(answer["content"], missed),
            content_ref=ref,
        )

    async def write(self, action: FileWriteAction) -> FileWriteObservation | ErrorObservation:
        content = action.content
        if action.content_ref is not None:
            try:
                content = await _content_of(action, self.blobs)
            except BlobMissing as exc:
                return error_observation(action, str(exc), "not_found")
        answer = await self.session.write({"path": action.path, "content": content}, _FILE_WAIT_S)
        return FileWriteObservation(
            **_answer_fields(action), path=answer["path"], content=_wrote(answer)
        )

    async def edit(self, action: FileEditAction) -> FileEditObservation:
        request: EditRequest = {
            "command": action.command,
            "path": action.path,
            "file_text": action.file_text,
            "old_str": action.old_str,
            "new_str": action.new_str,
            "insert_line": action.insert_line,
            "view_range": action.view_range,
            "limit": self.limit,
        }
        answer = await self.session.edit(request, _FILE_WAIT_S)
        return FileEditObservation(
            **_answer_fields(action),
            path=answer["path"],
            content=answer["content"],
            diff=answer["diff"],
        )


def _as_command(action: GlobAction | GrepAction | ApplyPatchAction) -> CmdRunAction:
    """The V1 tool as the command it runs in the task's shell (tool_commands.py)."""
    if isinstance(action, GlobAction):
        command = glob_command(action)
    elif isinstance(action, GrepAction):
        command = grep_command(action)
    else:
        command = patch_command(action)
    fields = action.model_dump(include={"id", "task_id", "source", "cause", "seq", "timestamp"})
    return CmdRunAction(command=command, timeout_s=_TOOL_TIMEOUT_S, **fields)


async def run_action(
    session: SandboxSession,
    action: RunnableAction,
    settings: RuntimeSettings,
    blobs: BlobStore | None = None,
    secrets: Mapping[str, str] | None = None,
) -> RuntimeObservation:
    """Run the action in a sandbox; executor-reported failures become an ErrorObservation.

    With `blobs`, output longer than output_limit is also kept whole (up to output_keep_bytes)
    in the blob store, and the observation carries its claim check (`content_ref`).
    SandboxLost and TimeoutError propagate: the caller decides what a dead sandbox means.
    With `secrets` ({name: value}, the task's), a command or cell runs with them in its
    environment (the executor's `env`, never in the command: see task_secrets.py) and a kept
    whole output has them redacted (the caller redacts the observation).
    """
    run = _ActionRun(session, settings, blobs, secrets or {})
    try:
        if isinstance(action, CmdRunAction):
            return await run.command(action)
        if isinstance(action, RunPythonAction):
            return await run.cell(action)
        if isinstance(action, FileReadAction):
            return await run.read(action)
        if isinstance(action, FileWriteAction):
            return await run.write(action)
        if isinstance(action, FileEditAction):
            return await run.edit(action)
        if isinstance(action, GlobAction | GrepAction | ApplyPatchAction):
            return await run.command(_as_command(action))
    except ExecutorError as exc:
        return error_observation(action, str(exc), exc.code)
    return error_observation(
        action, f"the runtime cannot run {type(action).__name__}", "unsupported_action"
    )


def _wrote(answer: WriteReply) -> str:
    """What a write did, saying so when it replaced a file or changed nothing."""
    text = f"Wrote {answer['size']} bytes to {answer['path']}"
    if answer.get("unchanged"):
        return f"{text}\nThe file already held exactly this, so nothing changed."
    if "previous_size" in answer:
        return (
            f"{text}\nThis replaced the file's previous content ({answer['previous_size']} bytes)."
        )
    return text
