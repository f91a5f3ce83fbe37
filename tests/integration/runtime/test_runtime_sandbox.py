"""Actions in a real sandbox container, through the attached executor (no docker exec)."""

from __future__ import annotations

import time
import uuid

import docker
import pytest
from runtime_helpers import GVISOR, differs_under_gvisor  # type: ignore[import-not-found]

from services.runtime.actions import observation_id, run_action
from services.runtime.containers import DockerSandboxes, Sandbox
from services.runtime.errors import SandboxStartError
from services.runtime.settings import RuntimeSettings
from shared.events import (
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    EventSource,
    FileReadAction,
    FileReadObservation,
    FileWriteAction,
    FileWriteObservation,
    PythonOutputObservation,
    RunnableAction,
    RunPythonAction,
)

pytestmark = pytest.mark.docker

TASK = "t-" + uuid.uuid4().hex[:8]


def cmd(command: str, **kw: object) -> CmdRunAction:
    return CmdRunAction(task_id=TASK, source=EventSource.AGENT, command=command, **kw)  # type: ignore[arg-type]


def py(code: str, **kw: object) -> RunPythonAction:
    return RunPythonAction(task_id=TASK, source=EventSource.AGENT, code=code, **kw)  # type: ignore[arg-type]


async def run(sandbox: Sandbox, action: RunnableAction, settings: RuntimeSettings):  # type: ignore[no-untyped-def]
    return await run_action(sandbox.session, action, settings)


async def test_shell_keeps_cwd_env_and_background_jobs(
    fresh_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    first = await run(
        fresh_sandbox, cmd("mkdir -p proj && cd proj && export GREETING=hello"), runtime_settings
    )
    assert isinstance(first, CmdOutputObservation)
    assert first.exit_code == 0
    assert first.cwd == "/workspace/proj"
    assert first.cause is not None and first.source is EventSource.ENVIRONMENT
    assert first.id == observation_id(first.cause)

    job = await run(fresh_sandbox, cmd("sleep 300 & echo started"), runtime_settings)
    assert isinstance(job, CmdOutputObservation) and "started" in job.content

    second = await run(
        fresh_sandbox, cmd("echo $GREETING; pwd; jobs | wc -l; false"), runtime_settings
    )
    assert isinstance(second, CmdOutputObservation)
    assert second.content.splitlines()[:3] == ["hello", "/workspace/proj", "1"]
    assert second.exit_code == 1
    assert second.cwd == "/workspace/proj"


async def test_multiline_script_with_heredoc_and_quotes(
    shared_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    script = (
        "cat <<'EOF' > /tmp/q.txt\nit's \"quoted\" $NOT\nEOF\n"
        "cat /tmp/q.txt\nexit_code=7\necho done"
    )
    obs = await run(shared_sandbox, cmd(script), runtime_settings)
    assert isinstance(obs, CmdOutputObservation)
    assert obs.content == 'it\'s "quoted" $NOT\ndone\n'
    assert obs.exit_code == 0


async def test_python_session_keeps_variables_and_shows_last_value(
    fresh_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    first = await run(
        fresh_sandbox,
        py(
            "import math\nsquares = [i * i for i in range(1, 11)]\n"
            "print('made', len(squares))\nsquares[-1]"
        ),
        runtime_settings,
    )
    assert isinstance(first, PythonOutputObservation)
    assert first.content == "made 10\n100\n"
    assert first.exit_code == 0
    second = await run(
        fresh_sandbox, py("total = sum(squares)\nmath.sqrt(total)"), runtime_settings
    )
    assert isinstance(second, PythonOutputObservation)
    assert second.content.strip() == str(385**0.5)
    failing = await run(fresh_sandbox, py("undefined_name + 1"), runtime_settings)
    assert isinstance(failing, PythonOutputObservation)
    assert failing.exit_code == 1
    assert "NameError" in failing.content and "<cell" in failing.content
    still = await run(fresh_sandbox, py("total"), runtime_settings)
    assert isinstance(still, PythonOutputObservation) and still.content.strip() == "385"


async def test_file_write_then_read_with_line_ranges(
    shared_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    body = "".join(f"line {i}\n" for i in range(1, 11))
    written = await run(
        shared_sandbox,
        FileWriteAction(
            task_id=TASK, source=EventSource.AGENT, path="notes/file.txt", content=body
        ),
        runtime_settings,
    )
    assert isinstance(written, FileWriteObservation)
    assert written.path == "/workspace/notes/file.txt"

    part = await run(
        shared_sandbox,
        FileReadAction(
            task_id=TASK,
            source=EventSource.AGENT,
            path="/workspace/notes/file.txt",
            start_line=3,
            end_line=5,
        ),
        runtime_settings,
    )
    assert isinstance(part, FileReadObservation)
    assert part.content == "line 3\nline 4\nline 5\n"

    tail = await run(
        shared_sandbox,
        FileReadAction(task_id=TASK, source=EventSource.AGENT, path="notes/file.txt", start_line=9),
        runtime_settings,
    )
    assert isinstance(tail, FileReadObservation) and tail.content == "line 9\nline 10\n"

    # The shell sees the same file: one workspace.
    seen = await run(shared_sandbox, cmd("wc -l < /workspace/notes/file.txt"), runtime_settings)
    assert isinstance(seen, CmdOutputObservation) and seen.content.strip() == "10"

    missing = await run(
        shared_sandbox,
        FileReadAction(task_id=TASK, source=EventSource.AGENT, path="nope.txt"),
        runtime_settings,
    )
    assert isinstance(missing, ErrorObservation)
    assert missing.error_code == "file_not_found"


async def test_long_output_is_cut_in_the_middle(
    shared_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    settings = runtime_settings.model_copy(update={"output_limit": 1000})
    obs = await run(shared_sandbox, cmd("seq 1 100000"), settings)
    assert isinstance(obs, CmdOutputObservation)
    assert obs.exit_code == 0
    assert obs.content.startswith("1\n2\n3\n")
    assert obs.content.rstrip().endswith("99999\n100000")
    assert "characters cut from the middle" in obs.content
    assert len(obs.content) < 1200
    full = len("".join(f"{i}\n" for i in range(1, 100001)))
    cut = int(obs.content.split("[... ")[1].split(" ")[0])
    assert cut == full - 1000


@differs_under_gvisor("Ctrl-C does not stop the command, so a hard timeout ends with a fresh shell")
async def test_hard_timeout_interrupts_and_shell_survives(
    fresh_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    await run(fresh_sandbox, cmd("cd /tmp && export KEEP=1"), runtime_settings)
    started = time.monotonic()
    obs = await run(
        fresh_sandbox, cmd("echo before; sleep 60; echo AFTER", timeout_s=1), runtime_settings
    )
    assert time.monotonic() - started < 8
    assert isinstance(obs, CmdOutputObservation)
    assert obs.timed_out
    assert "before" in obs.content and "AFTER" not in obs.content
    assert "timed out after 1s" in obs.content
    after = await run(fresh_sandbox, cmd("echo $KEEP; pwd"), runtime_settings)
    assert isinstance(after, CmdOutputObservation)
    assert after.content.split() == ["1", "/tmp"]

    cell = await run(
        fresh_sandbox, py("import time\nx = 5\ntime.sleep(60)", timeout_s=1), runtime_settings
    )
    assert isinstance(cell, PythonOutputObservation)
    assert "KeyboardInterrupt" in cell.content and "timed out" in cell.content
    kept = await run(fresh_sandbox, py("x"), runtime_settings)
    assert isinstance(kept, PythonOutputObservation) and kept.content.strip() == "5"


async def test_there_is_no_network(
    shared_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    obs = await run(
        shared_sandbox,
        cmd("ls /sys/class/net; (echo > /dev/tcp/1.1.1.1/53) 2>&1; echo rc=$?"),
        runtime_settings,
    )
    assert isinstance(obs, CmdOutputObservation)
    assert obs.content.split()[0] == "lo"
    assert "eth0" not in obs.content
    assert "rc=1" in obs.content
    dns = await run(
        shared_sandbox,
        py(
            "import socket\ntry:\n    socket.create_connection(('8.8.8.8', 53), timeout=3)\n"
            "    print('connected')\nexcept OSError as e:\n    print('blocked', e.errno)"
        ),
        runtime_settings,
    )
    assert isinstance(dns, PythonOutputObservation)
    assert dns.content.startswith("blocked")


async def test_loopback_and_localhost_work_without_a_network(
    shared_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    # Created with networking disabled (isolation.OFFLINE), the engine writes no /etc/hosts:
    # the image's own must name localhost and the sandbox's hostname, or every `curl
    # localhost:8000` an agent runs against its own server fails to resolve.
    served = await run(
        shared_sandbox,
        py(
            "import threading, urllib.request\n"
            "from http.server import HTTPServer, SimpleHTTPRequestHandler\n"
            "server = HTTPServer(('127.0.0.1', 0), SimpleHTTPRequestHandler)\n"
            "threading.Thread(target=server.serve_forever, daemon=True).start()\n"
            "url = 'http://localhost:%d/' % server.server_port\n"
            "print('status', urllib.request.urlopen(url, timeout=5).status)\n"
            "server.shutdown()"
        ),
        runtime_settings,
    )
    assert isinstance(served, PythonOutputObservation)
    assert "status 200" in served.content, served.content
    # IPv4 first, as Docker's /etc/hosts has it: Node 18 tries only the first address.
    names = await run(
        shared_sandbox,
        cmd(
            "node -e \"require('dns').lookup('localhost', (e, a) => console.log('node', a))\"; "
            'python3 -c "import socket; '
            "print('sandbox', socket.getaddrinfo('sandbox', 80)[0][4][0])\""
        ),
        runtime_settings,
    )
    assert isinstance(names, CmdOutputObservation)
    assert "node 127.0.0.1" in names.content, names.content
    assert "sandbox 127.0." in names.content, names.content


@differs_under_gvisor("/proc/self/status has no NoNewPrivs line")
async def test_cannot_write_outside_workspace_and_tmp(
    shared_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    probe = (
        "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status | tr -s '\\t' ' '; "
        "for p in /etc/x /x /usr/bin/x /opt/deckhands/executor/__init__.py /root/x /var/x; do "
        "  (echo hi > $p) 2>/dev/null && echo WROTE $p || echo denied $p; done; "
        "touch /workspace/ok /tmp/ok && echo ok-writable"
    )
    obs = await run(shared_sandbox, cmd(probe), runtime_settings)
    assert isinstance(obs, CmdOutputObservation)
    lines = obs.content.splitlines()
    assert lines[0] == "1000"
    assert "CapEff: 0000000000000000" in lines
    assert "NoNewPrivs: 1" in lines
    assert "WROTE" not in obs.content
    assert obs.content.count("denied") == 6
    assert "ok-writable" in obs.content
    via_file_action = await run(
        shared_sandbox,
        FileWriteAction(task_id=TASK, source=EventSource.AGENT, path="/etc/evil", content="x"),
        runtime_settings,
    )
    assert isinstance(via_file_action, ErrorObservation)
    assert via_file_action.error_code == "permission_denied"


async def test_container_is_hardened(
    shared_sandbox: Sandbox, docker_client: docker.DockerClient
) -> None:
    attrs = docker_client.api.inspect_container(shared_sandbox.container_id)
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    # No libnetwork hook at its start (isolation.OFFLINE): the same empty network namespace.
    assert attrs["Config"]["NetworkDisabled"] is True
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    # gVisor: room for the ptrace platform's host stubs; the guest's count is RLIMIT_NPROC.
    assert host["PidsLimit"] == (128 * 16 if GVISOR else 128)
    # 256 MiB for the processes, plus the tmpfs workspace's quota (make_settings: 64 MiB).
    assert host["Memory"] == (256 + 64) * 1024 * 1024
    [workspace] = [m for m in host["Mounts"] if m["Target"] == "/workspace"]
    assert "size=67108864,nr_inodes=4096," in str(workspace["VolumeOptions"]["DriverConfig"])
    assert host["MemorySwap"] == host["Memory"]
    assert host["NanoCpus"] == 1_000_000_000
    assert host["Init"] is (not GVISOR)  # under gVisor tini is PID 1 (containers.py says why)
    limits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]}
    expected = {"nofile": (4096, 4096), "fsize": (8 << 20, 8 << 20)}
    assert limits == ({**expected, "nproc": (128, 128)} if GVISOR else expected)
    assert host["LogConfig"]["Config"]["max-size"] == "1m"
    assert not host.get("Binds")
    # Root starts holder.py, which needs these two to leave root for uids 999 and 1000; the
    # agent's uid and capabilities are checked from inside (test_runtime_hostile).
    assert attrs["Config"]["User"] == "0:0"
    assert host["CapAdd"] == ["SETUID", "SETGID"]
    assert "/tmp" in host["Tmpfs"]
    for mount in attrs["Mounts"]:
        assert mount["Type"] in {"volume", "tmpfs"}, mount  # never a host path
        assert "docker.sock" not in str(mount)
    assert not attrs["NetworkSettings"]["Ports"]


async def test_a_file_cannot_grow_past_the_size_limit(
    shared_sandbox: Sandbox, runtime_settings: RuntimeSettings
) -> None:
    """RLIMIT_FSIZE (8 MiB in these tests): one process cannot fill the engine's disk with one
    file; the write fails where the limit is, and the shell goes on."""
    out = await run(
        shared_sandbox,
        cmd(
            "head -c 9000000 /dev/zero > /workspace/big.bin; echo rc=$?; "
            "stat -c %s /workspace/big.bin; ulimit -n; rm /workspace/big.bin"
        ),
        runtime_settings,
    )
    assert isinstance(out, CmdOutputObservation)
    lines = out.content.strip().splitlines()
    assert "File size limit exceeded" in out.content or lines[-3] != "rc=0", out.content
    assert lines[-2:] == [str(8 << 20), "4096"]


async def test_an_oci_runtime_the_engine_lacks_fails_start_up_with_the_reason(
    runtime_settings: RuntimeSettings,
) -> None:
    settings = runtime_settings.model_copy(update={"docker_runtime": "no-such-runtime"})
    lacking, in_use = DockerSandboxes(settings, "check"), DockerSandboxes(runtime_settings, "ok")
    try:
        with pytest.raises(SandboxStartError, match=r"'no-such-runtime' is not registered.*runc"):
            await lacking.check()
        await in_use.check()  # the runtime these tests use (runc, or runsc) is there
    finally:
        lacking.close()
        in_use.close()
