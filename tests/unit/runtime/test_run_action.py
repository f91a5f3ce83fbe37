"""Running an action through the sandbox contract, on the in-process FakeSandbox (no Docker):
what the runtime asks the executor for each kind of action, and what it makes of the answer."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, cast

import pytest

from services.runtime import actions
from services.runtime.actions import observation_id, run_action
from services.runtime.settings import RuntimeSettings
from shared.blobs import BlobStore
from shared.events import (
    BlobRef,
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    EventSource,
    FileEditAction,
    FileEditObservation,
    FileReadAction,
    FileReadObservation,
    FileWriteAction,
    FileWriteObservation,
    RunPythonAction,
)
from shared.sandbox_protocol.session import SandboxLost
from tests.fakes.sandbox import FakeSandbox

AGENT = EventSource.AGENT


class _Blobs:
    """The blob store's two calls run_action makes, in memory (the real one is JetStream's
    object store, tested in tests/integration)."""

    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}

    async def put(self, task_id: str, data: bytes, media_type: str | None = None) -> BlobRef:
        sha = hashlib.sha256(data).hexdigest()
        self.stored[sha] = data
        return BlobRef(sha256=sha, size=len(data))

    async def get(self, task_id: str, sha256: str) -> bytes:
        return self.stored[sha256]


def _settings(**overrides: Any) -> RuntimeSettings:
    return RuntimeSettings(**overrides)


async def test_a_command_is_one_bash_request_and_its_answer_the_observation() -> None:
    sandbox = FakeSandbox()
    action = CmdRunAction(task_id="t", source=AGENT, command="ls", timeout_s=7)
    obs = await run_action(sandbox, action, _settings(output_limit=1234))
    assert isinstance(obs, CmdOutputObservation)
    assert obs.content == "ran: ls\n" and obs.exit_code == 0 and obs.cwd == "/workspace"
    assert obs.id == observation_id(action.id) and obs.cause == action.id
    (request,) = sandbox.ops("bash")
    assert request["command"] == "ls" and request["timeout_s"] == 7
    assert request["limit"] == 1234 and request["keep"] == 0  # no blob store: nothing kept
    assert "env" not in request


async def test_secrets_travel_beside_the_command_never_in_it() -> None:
    sandbox = FakeSandbox()
    secrets = {"API_TOKEN": "t0ken-value", "BASH_ENV": "/tmp/evil.sh"}
    await run_action(
        sandbox,
        CmdRunAction(task_id="t", source=AGENT, command="echo $API_TOKEN"),
        _settings(),
        secrets=secrets,
    )
    await run_action(
        sandbox,
        RunPythonAction(task_id="t", source=AGENT, code="print(1)"),
        _settings(),
        secrets=secrets,
    )
    [(bash_op, bash), (python_op, python)] = sandbox.requests
    assert (bash_op, python_op) == ("bash", "python")  # one request each: no exports cell
    assert bash["command"] == "echo $API_TOKEN" and python["code"] == "print(1)"
    assert bash["env"] == python["env"] == {"API_TOKEN": "t0ken-value"}  # reserved names not


async def test_input_for_a_running_program_carries_no_secrets() -> None:
    sandbox = FakeSandbox()
    action = CmdRunAction(task_id="t", source=AGENT, command="C-c", is_input=True)
    await run_action(sandbox, action, _settings(), secrets={"API_TOKEN": "v"})
    (request,) = sandbox.ops("bash")
    assert request["is_input"] is True and "env" not in request


async def test_a_whole_output_is_fetched_in_pieces_redacted_into_the_blob_store() -> None:
    whole = "line with t0ken-value in it\n" * 100
    sandbox = FakeSandbox(commands=lambda request: (whole, 0))
    blobs = _Blobs()
    obs = await run_action(
        sandbox,
        CmdRunAction(task_id="t", source=AGENT, command="cat big"),
        _settings(output_limit=1000),
        blobs=cast(BlobStore, blobs),
        secrets={"API_TOKEN": "t0ken-value"},
    )
    assert isinstance(obs, CmdOutputObservation) and obs.content_ref is not None
    stored = blobs.stored[obs.content_ref.sha256]
    assert b"t0ken-value" not in stored and stored.count(b"line with") == 100
    assert len(sandbox.ops("chunk")) > 100  # 4-byte pieces, each its own request
    assert sandbox.kept == {}  # dropped with its last piece


async def test_files_are_written_read_and_edited_through_the_contract() -> None:
    sandbox = FakeSandbox()
    settings = _settings()
    wrote = await run_action(
        sandbox,
        FileWriteAction(task_id="t", source=AGENT, path="a.py", content="x = 1\n"),
        settings,
    )
    assert isinstance(wrote, FileWriteObservation)
    assert wrote.content == "Wrote 6 bytes to /workspace/a.py"
    again = FileWriteAction(task_id="t", source=AGENT, path="b.py", content="x = 1\n")
    await run_action(sandbox, again, settings)
    same = await run_action(sandbox, again, settings)
    assert isinstance(same, FileWriteObservation) and same.content == (
        "Wrote 6 bytes to /workspace/b.py\nThe file already held exactly this, so nothing changed."
    )
    other = again.model_copy(update={"content": "x = 22\n"})
    replaced = await run_action(sandbox, other, settings)
    assert isinstance(replaced, FileWriteObservation) and replaced.content == (
        "Wrote 7 bytes to /workspace/b.py\nThis replaced the file's previous content (6 bytes)."
    )
    edited = await run_action(
        sandbox,
        FileEditAction(
            task_id="t",
            source=AGENT,
            command="str_replace",
            path="a.py",
            old_str="1",
            new_str="2",
        ),
        settings,
    )
    assert isinstance(edited, FileEditObservation) and edited.path == "/workspace/a.py"
    read = await run_action(
        sandbox, FileReadAction(task_id="t", source=AGENT, path="a.py"), settings
    )
    assert isinstance(read, FileReadObservation) and read.content == "x = 2\n"


async def test_a_refusal_becomes_an_error_observation_with_its_code() -> None:
    sandbox = FakeSandbox()
    obs = await run_action(
        sandbox, FileReadAction(task_id="t", source=AGENT, path="missing.txt"), _settings()
    )
    assert isinstance(obs, ErrorObservation)
    assert obs.error_code == "file_not_found" and "missing.txt" in obs.content


async def test_a_lost_sandbox_and_a_timeout_reach_the_caller() -> None:
    """The caller decides what a dead or silent sandbox means (a fresh sandbox, a notice)."""
    gone = FakeSandbox()
    gone.lose("the container exited")
    with pytest.raises(SandboxLost, match="exited"):
        await run_action(gone, CmdRunAction(task_id="t", source=AGENT, command="ls"), _settings())
    dying = FakeSandbox(delay_s=30)
    asyncio.get_running_loop().call_later(0.1, dying.lose, "the engine removed it")
    with pytest.raises(SandboxLost, match="removed"):  # in flight when it went
        await run_action(dying, CmdRunAction(task_id="t", source=AGENT, command="ls"), _settings())
    silent = FakeSandbox(delay_s=30)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(TimeoutError):
        patch.setattr(actions, "_FILE_WAIT_S", 0.2)
        await run_action(
            silent, FileWriteAction(task_id="t", source=AGENT, path="f", content="x"), _settings()
        )
