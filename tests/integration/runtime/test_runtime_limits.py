"""Limits and interaction in a real sandbox: fork and memory bombs, input to running commands,
the file editor."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import docker
import pytest
from runtime_helpers import differs_under_gvisor  # type: ignore[import-not-found]

from services.runtime.actions import run_action
from services.runtime.containers import DockerSandboxes, Sandbox
from services.runtime.settings import RuntimeSettings
from shared.events import (
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    EventSource,
    FileEditAction,
    FileEditObservation,
    FileReadAction,
    FileReadObservation,
    PythonOutputObservation,
    RunPythonAction,
)
from shared.sandbox_protocol.session import answers

pytestmark = pytest.mark.docker

TASK = "t-" + uuid.uuid4().hex[:8]


def cmd(command: str, **kw: object) -> CmdRunAction:
    return CmdRunAction(task_id=TASK, source=EventSource.AGENT, command=command, **kw)  # type: ignore[arg-type]


def edit(command: str, path: str, **kw: Any) -> FileEditAction:
    return FileEditAction(
        task_id=TASK,
        source=EventSource.AGENT,
        command=command,  # type: ignore[arg-type]
        path=path,
        **kw,
    )


@differs_under_gvisor(
    "a fork bomb exhausts the host pids of the ptrace platform's stubs and ends the whole "
    "sandbox; /sys/fs/cgroup is empty"
)
async def test_fork_bomb_is_contained(
    fresh_sandbox: Sandbox,
    shared_sandbox: Sandbox,
    runtime_settings: RuntimeSettings,
    docker_client: docker.DockerClient,
) -> None:
    started = time.monotonic()
    bomb = await run_action(
        fresh_sandbox.session, cmd("bomb() { bomb | bomb & }; bomb", timeout_s=5), runtime_settings
    )
    assert isinstance(bomb, CmdOutputObservation)
    assert time.monotonic() - started < 25
    await asyncio.sleep(2)  # let it hit the ceiling
    # The sandbox's process count stops at its pids limit (read without forking anything).
    pids = await run_action(
        fresh_sandbox.session,
        FileReadAction(
            task_id=TASK, source=EventSource.AGENT, path="/sys/fs/cgroup/pids/pids.current"
        ),
        runtime_settings,
    )
    assert isinstance(pids, FileReadObservation)
    assert int(pids.content) <= runtime_settings.sandbox_pids
    # The executor still answers, and a neighbour sandbox is unaffected.
    assert await answers(fresh_sandbox.session, 5.0)
    t0 = time.monotonic()
    other = await run_action(shared_sandbox.session, cmd("echo unaffected"), runtime_settings)
    assert isinstance(other, CmdOutputObservation) and other.content == "unaffected\n"
    assert time.monotonic() - t0 < 5
    # And the host stays in control: the bombed sandbox goes away on request.
    docker_client.api.remove_container(fresh_sandbox.container_id, force=True, v=True)


async def test_foreground_fork_bomb_is_stopped_by_the_timeout(
    fresh_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    obs = await run_action(
        fresh_sandbox.session, cmd("bomb() { bomb | bomb; }; bomb", timeout_s=3), runtime_settings
    )
    assert isinstance(obs, CmdOutputObservation)
    assert obs.timed_out
    after = await run_action(
        fresh_sandbox.session, cmd("echo recovered", timeout_s=20), runtime_settings
    )
    assert isinstance(after, CmdOutputObservation)
    assert "recovered" in after.content


@differs_under_gvisor(
    "the memory limit applies to gVisor's kernel: a memory bomb ends the whole sandbox"
)
async def test_memory_bomb_is_killed_and_reported(
    fresh_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    shell = await run_action(
        fresh_sandbox.session,
        cmd("python3 -c 'x = []\nwhile True: x.append(bytearray(16 * 1024 * 1024))'"),
        runtime_settings,
    )
    assert isinstance(shell, CmdOutputObservation)
    assert shell.exit_code == 137
    assert "out of memory" in shell.content

    await run_action(
        fresh_sandbox.session,
        RunPythonAction(task_id=TASK, source=EventSource.AGENT, code="kept = 1"),
        runtime_settings,
    )
    cell = await run_action(
        fresh_sandbox.session,
        RunPythonAction(
            task_id=TASK, source=EventSource.AGENT, code="hog = bytearray(2 * 1024 ** 3)"
        ),
        runtime_settings,
    )
    assert isinstance(cell, PythonOutputObservation)
    assert cell.exit_code == 137
    assert "out of memory" in cell.content and "variables were lost" in cell.content
    # The sandbox lives on: the shell and a fresh Python session work.
    alive = await run_action(fresh_sandbox.session, cmd("echo alive"), runtime_settings)
    assert isinstance(alive, CmdOutputObservation) and alive.content == "alive\n"
    again = await run_action(
        fresh_sandbox.session,
        RunPythonAction(task_id=TASK, source=EventSource.AGENT, code="'kept' in globals()"),
        runtime_settings,
    )
    assert isinstance(again, PythonOutputObservation) and again.content.strip() == "False"


@differs_under_gvisor("Ctrl-C written to the PTY does not interrupt the foreground job")
async def test_no_output_timeout_leaves_the_command_running_for_input(
    fresh_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    quiet = await run_action(
        fresh_sandbox.session,
        cmd(
            "echo 'name?'; read name; echo \"hello $name\"; sleep 30; echo done",
            no_output_timeout_s=1.0,
        ),
        runtime_settings,
    )
    assert isinstance(quiet, CmdOutputObservation)
    assert quiet.exit_code == -1 and "still running" in quiet.content
    assert quiet.content.startswith("name?\n")

    answered = await run_action(
        fresh_sandbox.session, cmd("ada", is_input=True, no_output_timeout_s=1.0), runtime_settings
    )
    assert isinstance(answered, CmdOutputObservation)
    assert answered.content.startswith("hello ada\n") and answered.exit_code == -1

    stopped = await run_action(fresh_sandbox.session, cmd("C-c", is_input=True), runtime_settings)
    assert isinstance(stopped, CmdOutputObservation)
    assert stopped.exit_code == 130 and "done" not in stopped.content
    follow = await run_action(fresh_sandbox.session, cmd("echo next"), runtime_settings)
    assert isinstance(follow, CmdOutputObservation) and follow.content == "next\n"


async def test_file_editor_commands_return_diffs(
    shared_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    path = f"edit-{uuid.uuid4().hex[:6]}.py"
    created = await run_action(
        shared_sandbox.session, edit("create", path, file_text="a = 1\nb = 2\n"), runtime_settings
    )
    assert isinstance(created, FileEditObservation)
    assert created.path == f"/workspace/{path}" and "+b = 2" in created.diff

    replaced = await run_action(
        shared_sandbox.session,
        edit("str_replace", path, old_str="b = 2", new_str="b = 20"),
        runtime_settings,
    )
    assert isinstance(replaced, FileEditObservation)
    assert "-b = 2\n+b = 20" in replaced.diff

    ambiguous = await run_action(
        shared_sandbox.session,
        edit("str_replace", path, old_str=" = ", new_str="="),
        runtime_settings,
    )
    assert isinstance(ambiguous, ErrorObservation)
    assert ambiguous.error_code == "multiple_matches" and "2 times" in ambiguous.content
    missing = await run_action(
        shared_sandbox.session,
        edit("str_replace", path, old_str="zzz", new_str="y"),
        runtime_settings,
    )
    assert isinstance(missing, ErrorObservation) and missing.error_code == "no_match"

    await run_action(
        shared_sandbox.session,
        edit("insert", path, insert_line=0, new_str="# top"),
        runtime_settings,
    )
    view = await run_action(shared_sandbox.session, edit("view", path), runtime_settings)
    assert isinstance(view, FileEditObservation)
    assert view.content.splitlines() == ["     1\t# top", "     2\ta = 1", "     3\tb = 20"]

    undone = await run_action(shared_sandbox.session, edit("undo", path), runtime_settings)
    assert isinstance(undone, FileEditObservation) and "-# top" in undone.diff
    shown = await run_action(shared_sandbox.session, cmd(f"cat {path}"), runtime_settings)
    assert isinstance(shown, CmdOutputObservation) and shown.content == "a = 1\nb = 20\n"


@differs_under_gvisor(
    "runsc needs --network=none here (its root-netns check misfires on Linux 6.x): no egress"
)
async def test_network_is_opt_in(
    sandboxes: DockerSandboxes,
    runtime_settings: RuntimeSettings,
    docker_client: docker.DockerClient,
) -> None:
    opted = DockerSandboxes(
        runtime_settings.model_copy(update={"sandbox_network": True}), sandboxes.replica_id
    )
    sandbox = await opted.create()
    try:
        attrs = docker_client.api.inspect_container(sandbox.container_id)
        assert attrs["HostConfig"]["NetworkMode"] == "bridge"
        obs = await run_action(sandbox.session, cmd("ls /sys/class/net"), runtime_settings)
        assert isinstance(obs, CmdOutputObservation) and "eth0" in obs.content
    finally:
        await sandbox.session.close()
        await opted.remove(sandbox.container_id)
