"""The agent's processes: how they start (environment, signals, OOM score) and how they end."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import termios
import time

from .config import Fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from shared.sandbox_protocol.messages import BashRequest, PythonRequest


def child_setup(tty: bool) -> None:
    """Runs in a session's child before exec (Popen's preexec_fn)."""
    # Default signal handling, whatever ours is (an ignored SIGINT would be inherited, and
    # Ctrl-C would stop nothing). The user's processes are the OOM killer's first choice, so a
    # memory bomb takes down the bomb and not the executor.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError):
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    if tty:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def user_env() -> dict[str, str]:
    """The environment the shell and the Python process start with."""
    env = dict(os.environ)
    env.setdefault("HOME", "/tmp/home")
    env.update({"TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", "PS1": "", "PS2": ""})
    for name in ("PROMPT_COMMAND", "DECKHANDS_EXECUTOR"):
        env.pop(name, None)
    return env


def request_env(req: BashRequest | PythonRequest) -> dict[str, str]:
    """A request's `env`, checked: names of environment variables, string values without NUL.
    An error names the variable, never its value."""
    env = req.get("env") or {}
    if not isinstance(env, dict):
        raise Fail("bad_request", "env must be an object of names and values")
    for name, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", str(name)):
            raise Fail("bad_request", f"env: {str(name)[:130]!r} is not a variable name")
        if not isinstance(value, str) or "\0" in value:
            raise Fail("bad_request", f"env: the value of {name} is not a string without NUL")
    return env


def oom_kills() -> int | None:
    """The cgroup's OOM-kill count, to tell an out-of-memory kill from any other SIGKILL."""
    for path, key in (
        ("/sys/fs/cgroup/memory.events", "oom_kill"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),  # cgroup v1
    ):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def ancestors() -> set[int]:
    """This process, its parents (the holder, tini, Docker's init) and pid 1."""
    pids = {os.getpid(), 1}
    pid = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        pids.add(pid)
    return pids


def kill_session(sid: int) -> None:
    """Kill every process of a session (a shell and all its jobs)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                os.kill(int(name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def kill_all_but(spare: set[int]) -> int:
    """Freeze then kill every process this user can signal, except `spare` and our ancestors.

    Stopping first keeps a fork bomb from replacing what is killed.
    """
    keep = ancestors() | spare
    killed = 0
    for sig in (signal.SIGSTOP, signal.SIGKILL, signal.SIGKILL):
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in keep:
                continue
            try:
                os.kill(int(name), sig)
                killed += sig == signal.SIGKILL
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    return killed
