"""The `bash` operation: one interactive bash in a pseudo-terminal, for the sandbox's life."""

from __future__ import annotations

import codecs
import contextlib
import errno
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time

from .config import DEFAULT_LIMIT, DEFAULT_TIMEOUT_S, STATE_DIR, WORKSPACE, Fail
from .output import Captured, cut_middle, space_note, unlink_quietly
from .processes import child_setup, kill_all_but, kill_session, oom_kills, request_env, user_env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from shared.sandbox_protocol.messages import BashReply, BashRequest


class BashSession:
    """One interactive bash in a pseudo-terminal, driven one command at a time.

    A command is written to a file and `source`d, so multi-line scripts, heredocs and quotes
    need no escaping and `cd` or `export` persist. Bash's PROMPT_COMMAND prints an end marker
    with a per-session nonce, the exit code and the cwd; it runs even after Ctrl-C aborts a
    command. The terminal has echo and CR/LF translation off, so output is what programs wrote.

    A command's `env` (the task's secrets) must reach the shell without bash ever printing a
    value: the agent's shell may have `set -x` (each command traced, expanded, to stderr or to
    BASH_XTRACEFD), `set -v` (each line echoed as it is read) or a DEBUG trap (which sees each
    command's text). So no value is ever part of a line bash reads: the values go, as
    NUL-separated name/value pairs, into a file of their own (mode 0600 in the executor's 0700
    state directory), and the command's file starts with ENV_PRELUDE, one fixed line, the same
    for every task, that `read`s them into `export` and empties the file (a builtin: no `rm`
    on a PATH the agent may have changed) before the agent's command runs; the executor removes
    the empty file once the command is answered. The prelude first turns xtrace and verbose
    off, in a group whose own trace (of those two value-free commands) goes to /dev/null (or
    to the agent's BASH_XTRACEFD), exports with both off (a DEBUG trap would see only
    `builtin export "$__dh_n=$__dh_v"`, unexpanded), and restores the flags as its very last
    command, so that nothing after it on the line is traced. `set -v` echoes the prelude line
    itself, which holds no value; every command is `builtin`, unaffected by the agent's
    functions of those names.
    """

    ENV_PRELUDE = (
        "{ __dh_f=$-; builtin set +xv; } 2>/dev/null; "
        "while IFS= builtin read -r -d '' __dh_n && IFS= builtin read -r -d '' __dh_v; "
        'do builtin export "$__dh_n=$__dh_v"; done < %(env)s; '
        "builtin : >| %(env)s; builtin unset __dh_n __dh_v; "
        "case $__dh_f in *v*) builtin set -v;; esac; "
        "case $__dh_f in *x*) builtin unset __dh_f; builtin set -x;; "
        "*) builtin unset __dh_f;; esac\n"
    )

    def __init__(self, python_pid: Callable[[], int | None] = lambda: None) -> None:
        # The Python process, spared when a command that will not stop takes everything down.
        self.python_pid = python_pid
        self.proc: subprocess.Popen[bytes] | None = None
        self.master = -1
        self.nonce = ""
        self.marker: re.Pattern[str] | None = None
        self.running = False  # a command is still running after an earlier answer
        self.pending = ""  # output read but not yet answered (between answers)
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.counter = 0
        self._finished_meanwhile: tuple[int, str] | None = None

    # -- life cycle

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.close()
        os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
        unlink_quietly(self._env_file())  # values a killed command's shell never read
        master, slave = os.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.ONLCR
        attrs[3] &= ~(termios.ECHO | termios.ECHOE | termios.ECHOK | termios.ECHONL)
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        cwd = WORKSPACE if os.path.isdir(WORKSPACE) else "/"
        try:
            self.proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc", "--noediting", "-i"],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=user_env(),
                start_new_session=True,
                preexec_fn=lambda: child_setup(True),
            )
        finally:
            os.close(slave)
        self.master = master
        os.set_blocking(master, False)
        self.nonce = os.urandom(8).hex()
        self.marker = re.compile("\n?\x1eDH" + self.nonce + r" (-?\d+) (.*?)\x1e\n", re.DOTALL)
        self.running = False
        self.pending = ""
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # PROMPT_COMMAND is set, not exported: a nested shell must not print our marker.
        init = (
            " PS1=''; PS2=''; unset HISTFILE; "
            f'PROMPT_COMMAND=\'printf "\\n\\036DH{self.nonce} %s %s\\036\\n" "$?" "$PWD"\'\n'
        )
        os.write(self.master, init.encode())
        out = Captured(DEFAULT_LIMIT)
        status = self._read(out, time.monotonic() + 10.0, None)
        if status[0] != "done":
            raise Fail("shell_failed", f"bash did not start: {out.render()[-500:]!r}")

    def close(self) -> None:
        if self.proc is not None:
            # The shell's jobs live in their own process groups but in its session.
            kill_session(self.proc.pid)
            with contextlib.suppress(OSError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2)
        if self.master >= 0:
            with contextlib.suppress(OSError):
                os.close(self.master)
        self.proc, self.master = None, -1

    # -- reading

    def _read(self, out: Captured, deadline: float, quiet_s: float | None) -> tuple[str, int, str]:
        """Read until the end marker, the deadline, `quiet_s` without output, or bash's exit.

        Returns (status, exit_code, cwd) with status "done", "timeout", "quiet" or "exited".
        """
        assert self.marker is not None
        if self.pending:
            out.add(self.pending)
            self.pending = ""
        last_output = time.monotonic()
        while True:
            found = self.marker.search(out.tail)
            if found:
                rest = out.tail[found.end() :]
                out.trim_end(len(out.tail) - found.start())
                self.pending = rest
                return "done", int(found.group(1)), found.group(2)
            now = time.monotonic()
            wait = deadline - now
            if quiet_s is not None:
                wait = min(wait, last_output + quiet_s - now)
            if wait <= 0:
                return ("timeout" if now >= deadline else "quiet"), -1, ""
            try:
                # Bounded wait: a background job can hold the terminal open after bash exits,
                # so the end of bash is noticed by polling it, not by EOF alone.
                ready, _, _ = select.select([self.master], [], [], min(wait, 0.25))
            except InterruptedError:
                continue
            if not ready:
                if self.proc is not None and self.proc.poll() is not None:
                    return "exited", -1, ""
                continue
            try:
                data = os.read(self.master, 65536)
            except BlockingIOError:
                continue
            except OSError as exc:  # EIO: the terminal's other side is gone, bash exited
                if exc.errno != errno.EIO:
                    raise
                data = b""
            if not data:
                out.add(self.decoder.decode(b"", final=True))
                return "exited", -1, ""
            out.add(self.decoder.decode(data))
            last_output = time.monotonic()

    def _drain(self) -> None:
        """Collect whatever a still-running command printed since the last answer."""
        out = Captured(1 << 30)
        status, code, cwd = self._read(out, time.monotonic(), None)
        self.pending = out.render() + self.pending
        if status == "done":
            self.running = False
            self._finished_meanwhile = (code, cwd)

    # -- commands

    def run(self, req: BashRequest) -> BashReply:
        limit = int(req.get("limit") or DEFAULT_LIMIT)
        timeout_s = float(req.get("timeout_s") or DEFAULT_TIMEOUT_S)
        quiet = req.get("no_output_timeout_s")
        quiet_s = float(quiet) if quiet else None
        is_input = bool(req.get("is_input"))
        command = str(req.get("command", ""))
        env = {} if is_input else request_env(req)
        notes: list[str] = []
        if not self.alive():
            if self.proc is not None:
                notes.append("[the previous shell had died; a new shell was started]")
            self.start()
        out = Captured(limit, int(req.get("keep") or 0), "bash.out")
        deadline = time.monotonic() + timeout_s
        self._finished_meanwhile = None
        if is_input:
            refused = self._send_input(command, limit)
        else:
            refused = self._send_command(command, env, out, notes, limit)
        if refused is not None:
            return refused
        return self._wait(out, deadline, quiet_s, timeout_s, env, notes)

    def _send_input(self, text: str, limit: int) -> BashReply | None:
        """Type `text` into the running command; the answer instead when none is running."""
        if self.running:
            self._drain()
        if not self.running:
            output = self.pending
            self.pending = ""
            code, cwd = self._finished_meanwhile or (-1, "")
            return {
                "ok": True,
                "output": cut_middle("", 0, output, limit),
                "exit_code": code,
                "cwd": cwd or self._cwd(),
                "timed_out": False,
                "running": False,
                "note": "[no command is running; the input was not sent]",
            }
        os.write(self.master, _keys(text))
        return None

    def _send_command(
        self, command: str, env: dict[str, str], out: Captured, notes: list[str], limit: int
    ) -> BashReply | None:
        """Start `command`; the answer instead while an earlier command still runs."""
        if self.running:
            self._drain()
        if self.running:
            output = self.pending
            self.pending = ""
            return {
                "ok": True,
                "output": cut_middle("", 0, output, limit),
                "exit_code": -1,
                "cwd": "",
                "timed_out": False,
                "running": True,
                "note": (
                    "[the previous command is still running; this command was NOT run. "
                    "Send input to it with is_input=true, e.g. C-c to interrupt it]"
                ),
            }
        if self.pending:
            notes.append("[output printed in the background since the last command:]")
            out.add(self.pending + "\n[end of background output]\n")
            self.pending = ""
        self.counter += 1
        script = os.path.join(STATE_DIR, "command.sh")
        with open(script, "w", encoding="utf-8") as f:
            if env:
                f.write(self.ENV_PRELUDE % {"env": self._write_env(env)})
            f.write(command if command.endswith("\n") else command + "\n")
        self.running = True
        os.write(self.master, f" builtin source {script}\n".encode())
        return None

    def _wait(
        self,
        out: Captured,
        deadline: float,
        quiet_s: float | None,
        timeout_s: float,
        env: dict[str, str],
        notes: list[str],
    ) -> BashReply:
        """Read what the command prints until it ends, goes quiet or times out; answer."""
        before_oom = oom_kills()
        status, code, cwd = self._read(out, deadline, quiet_s)
        if env:
            # Emptied by the prelude already; gone too, now.
            unlink_quietly(self._env_file())
        timed_out = False
        if status == "quiet":
            notes.append(
                f"[no new output for {quiet_s:g}s; the command is still running. Send input "
                "with is_input=true (an empty input waits for more output, C-c interrupts)]"
            )
            return self._answer(out, -1, "", False, True, notes)
        if status == "timeout":
            timed_out = True
            status, code, cwd = self._interrupt(out, notes, timeout_s)
        if status == "exited":
            rc = self.proc.wait(5) if self.proc else -1
            self.close()
            notes.append(
                f"[the shell exited with code {rc}; a new shell was started in {WORKSPACE}: "
                "the working directory, variables and background jobs were reset]"
            )
            self.start()
            code, cwd = rc if rc >= 0 else 128 - rc, self._cwd()
        self.running = False
        after_oom = oom_kills()
        if before_oom is not None and after_oom is not None and after_oom > before_oom:
            notes.append(
                "[a process was killed because the sandbox ran out of memory (memory limit)]"
            )
        return self._answer(out, code, cwd, timed_out, False, notes)

    @staticmethod
    def _env_file() -> str:
        return os.path.join(STATE_DIR, "command.env")

    def _write_env(self, env: dict[str, str]) -> str:
        """Write `env` for the prelude to read; its path (a fixed name of ours: no quoting)."""
        path = self._env_file()
        unlink_quietly(path)  # a file left by a crash, or a link someone put there
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            for name, value in sorted(env.items()):
                f.write(name.encode() + b"\0" + value.encode("utf-8", "surrogateescape") + b"\0")
        return path

    def _interrupt(self, out: Captured, notes: list[str], timeout_s: float) -> tuple[str, int, str]:
        """Stop the running command: Ctrl-C, then kill its process group, then everything."""
        notes.append(f"[the command timed out after {timeout_s:g}s and was interrupted]")
        os.write(self.master, b"\x03")
        status, code, cwd = self._read(out, time.monotonic() + 2.0, None)
        if status != "timeout":
            return status, code, cwd
        with contextlib.suppress(OSError):
            pgrp = os.tcgetpgrp(self.master)
            if self.proc is not None and pgrp != self.proc.pid:
                os.killpg(pgrp, signal.SIGKILL)
        status, code, cwd = self._read(out, time.monotonic() + 2.0, None)
        if status != "timeout":
            return status, code, cwd
        spare = {p for p in (self.python_pid(),) if p}
        kill_all_but(spare)
        self.close()
        notes.append(
            "[the command would not stop: all shell processes were killed and a new shell was "
            f"started in {WORKSPACE}; the working directory, variables and jobs were reset]"
        )
        self.start()
        return "done", 137, self._cwd()

    def _cwd(self) -> str:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                return os.readlink(f"/proc/{self.proc.pid}/cwd")
        return WORKSPACE

    def _answer(
        self, out: Captured, code: int, cwd: str, timed_out: bool, running: bool, notes: list[str]
    ) -> BashReply:
        output = out.render()
        return {
            "ok": True,
            "output": output,
            "exit_code": code,
            "cwd": cwd or self._cwd(),
            "timed_out": timed_out,
            "running": running,
            "note": "\n".join(n for n in (*notes, space_note(output)) if n),
            **out.kept(),
        }


_KEYS = {"C-c": b"\x03", "C-d": b"\x04", "C-z": b"\x1a", "C-\\": b"\x1c"}


def _keys(text: str) -> bytes:
    """Input for a running command: 'C-c' and friends are control keys, the rest is typed."""
    stripped = text.strip()
    if stripped in _KEYS:
        return _KEYS[stripped]
    if not text:
        return b""
    return (text if text.endswith("\n") else text + "\n").encode()
