#!/usr/bin/env python3
"""deckhands' in-sandbox executor, run as the sandbox user (uid 1000) by holder.py.

Standard library only, and it imports nothing of the project: it is copied alone into the image.

Protocol: one JSON object per line. Requests arrive on stdin, responses leave on stdout (the
runtime reaches both through `docker attach`; no `docker exec`, no port). In the sandbox these
are pipes to holder.py, which alone (with root's docker-init and tini) holds the channel itself.
Every request has an `id` and an `op`; its response carries the same `id` and `ok`. Diagnostics
go to stderr (the container's capped log), never to stdout.

  ping                                  -> {ok, pid, uptime_s, protocol}
  bash   {command, timeout_s, no_output_timeout_s?, is_input?, limit?, env?}
                                        -> {ok, output, exit_code, cwd, timed_out, running, note}
  python {code, timeout_s, limit?, env?} -> {ok, output, exit_code, timed_out, note}
  read   {path, start_line?, end_line?, limit?} -> {ok, path, content, total_lines}
  write  {path, content}                -> {ok, path, size}
  edit   {command, path, ...}           -> {ok, path, content, diff}
  chunk  {name, offset, size?, drop?}   -> {ok, data, next, eof}
  errors                                -> {ok: false, error, code}

State that lives as long as the sandbox: one bash session in a pseudo-terminal (cwd, variables,
functions and background jobs survive between commands), and one Python process whose globals
survive between cells. Requests for different parts run concurrently (a ping is answered while a
command runs); requests for the same part run in order.

Whole output: `bash`, `python` and `read` take `keep` (bytes). When the output is longer than
`limit`, the answer's `output`/`content` is still cut in the middle, and the whole of it, if it
fits in `keep`, is kept in a file under /tmp/.deckhands/kept; the answer names it (`kept`,
`kept_bytes`). The runtime fetches it with `chunk` (pieces small enough for one protocol line,
on UTF-8 boundaries) and stores it outside the sandbox. Each part keeps one file at a time.

Environment: `bash` (a command, not input) and `python` take `env`, {name: value}, exported
into the shell or the Python process before the command or cell runs (a task's secrets). The
values never appear in any code the shell or Python reads: see `BashSession.ENV_PRELUDE`.
"""

from __future__ import annotations

# Start-up time counts (every new sandbox pays it), so only built-in modules are imported here:
# the first ping is answered while the rest loads (`_load_modules`) in a background thread.
import _thread
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import codecs
    import contextlib
    import errno
    import fcntl
    import json
    import queue
    import re
    import select
    import signal
    import stat
    import struct
    import subprocess
    import termios
    import threading
    from typing import Any

_MODULES = (
    "codecs",
    "contextlib",
    "errno",
    "fcntl",
    "json",
    "queue",
    "re",
    "select",
    "signal",
    "stat",
    "struct",
    "subprocess",
    "termios",
    "threading",
)


def _load_modules() -> None:
    namespace = globals()
    for name in _MODULES:
        if name not in namespace:
            namespace[name] = __import__(name)


PROTOCOL = 2  # 2: `env` on bash and python
WORKSPACE = os.environ.get("DECKHANDS_WORKSPACE", "/workspace")
STATE_DIR = os.environ.get("DECKHANDS_STATE_DIR", "/tmp/.deckhands")
KEPT_DIR = STATE_DIR + "/kept"
KEPT_NAMES = ("bash.out", "python.out", "read.out")
# Bytes of a kept file per `chunk` answer: JSON may escape a control character as 6 bytes, so
# even the worst piece stays well below the runtime's 1 MiB line limit.
CHUNK_BYTES = 128 * 1024
DEFAULT_LIMIT = 30_000
DEFAULT_TIMEOUT_S = 120.0
# Kept beyond the limit while reading, so the tail survives until the end marker is seen.
_SLACK = 16_384
STARTED = time.monotonic()


def log(message: str) -> None:
    sys.stderr.write(f"executor: {message}\n")
    sys.stderr.flush()


class Fail(Exception):
    """An error the caller should see, with a machine-readable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- output handling


class Captured:
    """Output that is cut in the middle once it exceeds `limit`, without holding all of it.

    With `keep` > 0 the whole output also goes to a file (`kept_name` under KEPT_DIR) while it
    stays within `keep` bytes; `kept()` then names it when the output was cut.
    """

    def __init__(self, limit: int, keep: int = 0, kept_name: str = "") -> None:
        self.limit = max(1, limit)
        self.head = ""
        self.tail = ""
        self.dropped = 0
        self.keep = keep if kept_name else 0
        self.kept_name = kept_name
        self.kept_bytes = 0
        self._kept_file: Any = None
        if self.keep:
            _unlink_kept(kept_name)  # the part's previous output, fetched or abandoned

    def _keep(self, text: str) -> None:
        if not self.keep or not text:
            return
        data = text.encode("utf-8", "replace")
        try:
            if self._kept_file is None:
                os.makedirs(KEPT_DIR, mode=0o700, exist_ok=True)
                self._kept_file = open(os.path.join(KEPT_DIR, self.kept_name), "wb")
            if self.kept_bytes + len(data) > self.keep:
                raise OSError("longer than keep")
            self._kept_file.write(data)
            self.kept_bytes += len(data)
        except OSError:  # too long, or /tmp is full: the cut output is all there is
            self._stop_keeping()

    def _stop_keeping(self) -> None:
        if self._kept_file is not None:
            with contextlib.suppress(OSError):
                self._kept_file.close()
            self._kept_file = None
        self.keep = 0
        _unlink_kept(self.kept_name)

    def trim_end(self, count: int) -> None:
        """Remove the last `count` characters (the shell's end marker and what follows it)."""
        if count <= 0:
            return
        removed = self.tail[-count:]
        self.tail = self.tail[:-count]
        if self._kept_file is not None:
            size = len(removed.encode("utf-8", "replace"))
            try:
                self._kept_file.flush()
                self.kept_bytes = max(0, self.kept_bytes - size)
                self._kept_file.truncate(self.kept_bytes)
                self._kept_file.seek(self.kept_bytes)
            except OSError:
                self._stop_keeping()

    def kept(self) -> dict[str, Any]:
        """`{kept, kept_bytes}` when the output was cut and is kept whole; else nothing."""
        if self._kept_file is None:
            return {}
        try:
            self._kept_file.close()
        except OSError:
            self._kept_file = None
            self._stop_keeping()
            return {}
        self._kept_file = None
        if len(self.head) + self.dropped + len(self.tail) <= self.limit:
            _unlink_kept(self.kept_name)  # not cut: the answer carries all of it
            return {}
        return {"kept": self.kept_name, "kept_bytes": self.kept_bytes}

    def add(self, text: str) -> None:
        self._keep(text)
        self.tail += text
        keep = self.limit - self.limit // 2 + _SLACK
        if len(self.tail) > keep + self.limit + _SLACK:
            if not self.head and not self.dropped:
                self.head = self.tail[: self.limit // 2]
                self.tail = self.tail[len(self.head) :]
            excess = len(self.tail) - keep
            if excess > 0:
                self.dropped += excess
                self.tail = self.tail[excess:]

    def render(self, tail: str | None = None) -> str:
        return cut_middle(self.head, self.dropped, self.tail if tail is None else tail, self.limit)


def _whole_characters(data: bytes) -> int:
    """Length of `data` without a UTF-8 character cut at its end."""
    end = len(data)
    start = end - 1
    while start >= 0 and end - start < 4 and (data[start] & 0xC0) == 0x80:
        start -= 1  # continuation bytes: find the character's first byte
    if start < 0:
        return end
    lead = data[start]
    width = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return start if start + width > end else end


def _unlink_kept(name: str) -> None:
    _unlink_quietly(os.path.join(KEPT_DIR, name))


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def keep_whole(name: str, text: str, limit: int, keep: int) -> dict[str, Any]:
    """Keep `text` (already whole in memory) like Captured does, when it is longer than limit."""
    if keep <= 0 or len(text) <= limit:
        return {}
    out = Captured(limit, keep, name)
    out.head, out.dropped = "", len(text)  # counts as cut without holding it twice
    out._keep(text)
    return out.kept()


def cut_middle(head: str, dropped: int, tail: str, limit: int) -> str:
    total = len(head) + dropped + len(tail)
    if total <= limit:
        return head + tail
    half = limit // 2
    first = (head + tail)[:half] if not dropped else head[:half]
    last = tail[-(limit - half) :] if limit - half else ""
    cut = total - len(first) - len(last)
    return f"{first}\n\n[... {cut} characters cut from the middle of the output ...]\n\n{last}"


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


def _child_setup(tty: bool) -> None:
    # Runs in the child before exec. Default signal handling, whatever ours is (an ignored
    # SIGINT would be inherited, and Ctrl-C would stop nothing). The user's processes are the
    # OOM killer's first choice, so a memory bomb takes down the bomb and not the executor.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError):
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    if tty:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _space_note(output: str) -> str:
    """space.py's note when the sandbox ran out of room (loaded on first use: start-up counts)."""
    try:
        from space import space_note
    except ImportError:  # only where executor.py runs without its directory on the path
        return ""
    return space_note(output)


def _request_env(req: dict[str, Any]) -> dict[str, str]:
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


def _user_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HOME", "/tmp/home")
    env.update({"TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", "PS1": "", "PS2": ""})
    for name in ("PROMPT_COMMAND", "DECKHANDS_EXECUTOR"):
        env.pop(name, None)
    return env


def _resolve(path: str) -> str:
    if not path:
        raise Fail("bad_request", "path is empty")
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(WORKSPACE, path))


def _ancestors() -> set[int]:
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
    keep = _ancestors() | spare
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


# --------------------------------------------------------------------------- bash


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

    def __init__(self) -> None:
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
        _unlink_quietly(self._env_file())  # values a killed command's shell never read
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
                env=_user_env(),
                start_new_session=True,
                preexec_fn=lambda: _child_setup(True),
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

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        limit = int(req.get("limit") or DEFAULT_LIMIT)
        timeout_s = float(req.get("timeout_s") or DEFAULT_TIMEOUT_S)
        quiet = req.get("no_output_timeout_s")
        quiet_s = float(quiet) if quiet else None
        is_input = bool(req.get("is_input"))
        command = str(req.get("command", ""))
        env = {} if is_input else _request_env(req)
        notes: list[str] = []
        if not self.alive():
            if self.proc is not None:
                notes.append("[the previous shell had died; a new shell was started]")
            self.start()
        out = Captured(limit, int(req.get("keep") or 0), "bash.out")
        deadline = time.monotonic() + timeout_s
        self._finished_meanwhile = None

        if is_input:
            if self.running:
                self._drain()
            if not self.running:
                text = self.pending
                self.pending = ""
                code, cwd = self._finished_meanwhile or (-1, "")
                return {
                    "ok": True,
                    "output": cut_middle("", 0, text, limit),
                    "exit_code": code,
                    "cwd": cwd or self._cwd(),
                    "timed_out": False,
                    "running": False,
                    "note": "[no command is running; the input was not sent]",
                }
            os.write(self.master, _keys(command))
        else:
            if self.running:
                self._drain()
            if self.running:
                text = self.pending
                self.pending = ""
                return {
                    "ok": True,
                    "output": cut_middle("", 0, text, limit),
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

        before_oom = oom_kills()
        status, code, cwd = self._read(out, deadline, quiet_s)
        if env:
            # Emptied by the prelude already; gone too, now.
            _unlink_quietly(self._env_file())
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
        _unlink_quietly(path)  # a file left by a crash, or a link someone put there
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
        spare = {p for p in (PYTHON.pid(),) if p}
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
    ) -> dict[str, Any]:
        output = out.render()
        return {
            "ok": True,
            "output": output,
            "exit_code": code,
            "cwd": cwd or self._cwd(),
            "timed_out": timed_out,
            "running": running,
            "note": "\n".join(n for n in (*notes, _space_note(output)) if n),
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


# --------------------------------------------------------------------------- python


class PythonSession:
    """A separate Python process whose globals persist between cells, like an IPython kernel.

    Separate so that a cell cannot corrupt the protocol on our stdout, and so that a cell that
    will not stop can be killed (its variables are then lost, and the answer says so).
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.ctrl_w = -1
        self.ctrl_r = -1
        self.out_r = -1
        self.decoder: codecs.IncrementalDecoder | None = None

    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        self.close()
        to_kernel_r, to_kernel_w = os.pipe()
        from_kernel_r, from_kernel_w = os.pipe()
        out_r, out_w = os.pipe()
        cwd = WORKSPACE if os.path.isdir(WORKSPACE) else "/"
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-u",
                    os.path.abspath(__file__),
                    "--kernel",
                    str(to_kernel_r),
                    str(from_kernel_w),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=out_w,
                cwd=cwd,
                env=_user_env(),
                pass_fds=(to_kernel_r, from_kernel_w),
                start_new_session=True,
                preexec_fn=lambda: _child_setup(False),
            )
        finally:
            for fd in (to_kernel_r, from_kernel_w, out_w):
                os.close(fd)
        self.ctrl_w, self.ctrl_r, self.out_r = to_kernel_w, from_kernel_r, out_r
        os.set_blocking(self.out_r, False)
        os.set_blocking(self.ctrl_r, False)
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2)
        for fd in (self.ctrl_w, self.ctrl_r, self.out_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.proc, self.ctrl_w, self.ctrl_r, self.out_r = None, -1, -1, -1

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        limit = int(req.get("limit") or DEFAULT_LIMIT)
        timeout_s = float(req.get("timeout_s") or DEFAULT_TIMEOUT_S)
        env = _request_env(req)
        notes: list[str] = []
        if self.pid() is None:
            if self.proc is not None:
                notes.append("[the previous Python process had died; its variables were lost]")
            self.start()
        assert self.proc is not None
        out = Captured(limit, int(req.get("keep") or 0), "python.out")
        before_oom = oom_kills()
        # The environment travels beside the cell, not in its code: the kernel keeps each
        # cell's source for tracebacks (linecache), and the cell's numbering stays the agent's.
        message = (json.dumps({"code": str(req.get("code", "")), "env": env}) + "\n").encode()
        try:
            os.write(self.ctrl_w, message)
        except OSError:
            self.close()
            self.start()
            os.write(self.ctrl_w, message)
        deadline = time.monotonic() + timeout_s
        status, result = self._collect(out, deadline)
        timed_out = False
        if status == "timeout":
            timed_out = True
            notes.append(f"[the cell timed out after {timeout_s:g}s and was interrupted]")
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, signal.SIGINT)
            status, result = self._collect(out, time.monotonic() + 2.0)
            if status == "timeout":
                self.close()
                notes.append(
                    "[the cell would not stop: the Python process was killed and its "
                    "variables were lost]"
                )
                status, result = "done", {"rc": 137}
        if status == "died":
            try:
                rc = self.proc.wait(5) if self.proc is not None else -1
            except subprocess.TimeoutExpired:
                rc = -9
            self._drain_output(out)
            after = oom_kills()
            if before_oom is not None and after is not None and after > before_oom:
                notes.append(
                    "[the Python process was killed because the sandbox ran out of "
                    "memory (memory limit); its variables were lost]"
                )
            else:
                notes.append(f"[the Python process died (code {rc}); its variables were lost]")
            self.close()
            result = {"rc": rc if rc >= 0 else 128 - rc}
        output = out.render()
        return {
            "ok": True,
            "output": output,
            "exit_code": int(result.get("rc", 1)),
            "timed_out": timed_out,
            "note": "\n".join(n for n in (*notes, _space_note(output)) if n),
            **out.kept(),
        }

    def _drain_output(self, out: Captured) -> None:
        while self.out_r >= 0 and self.decoder is not None:
            try:
                data = os.read(self.out_r, 65536)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            out.add(self.decoder.decode(data))

    def _collect(self, out: Captured, deadline: float) -> tuple[str, dict[str, Any]]:
        """Gather output until the kernel reports the cell done.

        Returns ("done", result), ("timeout", {}) or ("died", {}).
        """
        ctrl = b""
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                return "timeout", {}
            try:
                ready, _, _ = select.select([self.out_r, self.ctrl_r], [], [], min(wait, 0.5))
            except InterruptedError:
                continue
            if self.out_r in ready:
                self._drain_output(out)
            if self.ctrl_r in ready:
                try:
                    chunk = os.read(self.ctrl_r, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return "died", {}
                ctrl += chunk
                if b"\n" in ctrl:
                    # Everything the cell printed was flushed before "done" was written.
                    self._drain_output(out)
                    line = ctrl.split(b"\n", 1)[0]
                    try:
                        parsed: dict[str, Any] = json.loads(line)
                    except ValueError:
                        parsed = {"rc": 1}
                    return "done", parsed
            if not ready and self.proc is not None and self.proc.poll() is not None:
                return "died", {}


def kernel_main(ctrl_in: int, ctrl_out: int) -> None:
    """The Python process's loop: run each cell in one persistent namespace."""
    _load_modules()
    import ast
    import linecache
    import traceback

    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    sys.argv = [""]
    reader = os.fdopen(ctrl_in, "rb")
    writer = os.fdopen(ctrl_out, "wb")
    cell = 0
    for raw in reader:
        cell += 1
        rc = 0
        try:
            request = json.loads(raw)
            code = request["code"]
            os.environ.update(request.get("env") or {})
            name = f"<cell {cell}>"
            linecache.cache[name] = (len(code), None, code.splitlines(True), name)
            tree = ast.parse(code, name, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, "exec"), namespace)
            if last is not None:
                value = eval(compile(last, name, "eval"), namespace)
                if value is not None:
                    namespace["_"] = value
                    print(repr(value))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            exc_type, exc_value, tb = sys.exc_info()
            # Drop our own frame so the traceback starts in the cell.
            traceback.print_exception(exc_type, exc_value, tb.tb_next if tb else None)
            rc = 1
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        writer.write((json.dumps({"rc": rc}) + "\n").encode())
        writer.flush()


# --------------------------------------------------------------------------- files


class Files:
    """Reading, writing and editing files as the sandbox user (the kernel enforces access)."""

    def __init__(self) -> None:
        self.history: dict[str, list[str | None]] = {}

    def read(self, req: dict[str, Any]) -> dict[str, Any]:
        path = _resolve(str(req.get("path", "")))
        text = _read_text(path)
        lines = text.splitlines(True)
        start = int(req.get("start_line") or 1)
        end = req.get("end_line")
        stop = len(lines) if end is None else min(int(end), len(lines))
        if start > max(len(lines), 1):
            raise Fail(
                "bad_range", f"{path} has {len(lines)} lines; start_line {start} is past the end"
            )
        if end is not None and int(end) < start:
            raise Fail("bad_range", f"end_line {end} is before start_line {start}")
        content = "".join(lines[start - 1 : stop])
        limit = int(req.get("limit") or DEFAULT_LIMIT)
        return {
            "ok": True,
            "path": path,
            "content": cut_middle("", 0, content, limit),
            "total_lines": len(lines),
            **keep_whole("read.out", content, limit, int(req.get("keep") or 0)),
        }

    def chunk(self, req: dict[str, Any]) -> dict[str, Any]:
        """A piece of a kept file, from byte `offset`, ending on a UTF-8 character boundary."""
        name = str(req.get("name", ""))
        if name not in KEPT_NAMES:
            raise Fail("bad_request", f"no kept output is called {name!r}")
        offset = max(0, int(req.get("offset") or 0))
        size = min(max(4, int(req.get("size") or CHUNK_BYTES)), CHUNK_BYTES)
        path = os.path.join(KEPT_DIR, name)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(size + 1)
        except FileNotFoundError:
            raise Fail("not_found", f"the kept output {name!r} is gone") from None
        eof = len(data) <= size
        data = data[:size]
        if not eof:
            data = data[: _whole_characters(data)]
        if eof and req.get("drop"):
            _unlink_kept(name)
        return {
            "ok": True,
            "data": data.decode("utf-8", "replace"),
            "next": offset + len(data),
            "eof": eof,
        }

    def write(self, req: dict[str, Any]) -> dict[str, Any]:
        path = _resolve(str(req.get("path", "")))
        content = str(req.get("content", ""))
        self._remember(path)
        _write_text(path, content)
        return {"ok": True, "path": path, "size": len(content.encode())}

    # -- the OpenHands editor's commands

    def edit(self, req: dict[str, Any]) -> dict[str, Any]:
        command = str(req.get("command", ""))
        path = _resolve(str(req.get("path", "")))
        limit = int(req.get("limit") or DEFAULT_LIMIT)
        if command == "view":
            return self._view(path, req, limit)
        if command == "create":
            if os.path.exists(path):
                raise Fail("file_exists", f"{path} already exists; use str_replace or write")
            new = str(req.get("file_text") or "")
            self._remember(path)
            _write_text(path, new)
            return self._edited(path, "", new, f"Created {path}", limit)
        if command == "str_replace":
            old_str = req.get("old_str")
            if not old_str:
                raise Fail("bad_request", "str_replace needs a non-empty old_str")
            new_str = str(req.get("new_str") or "")
            old = _read_text(path)
            count = old.count(old_str)
            if count == 0:
                raise Fail("no_match", f"old_str was not found in {path}; nothing was changed")
            if count > 1:
                at = [
                    old.count("\n", 0, m.start()) + 1 for m in re.finditer(re.escape(old_str), old)
                ]
                raise Fail(
                    "multiple_matches",
                    f"old_str occurs {count} times in {path} (lines "
                    f"{', '.join(map(str, at[:20]))}); make it unique. Nothing changed",
                )
            new = old.replace(old_str, new_str, 1)
            self._remember(path)
            _write_text(path, new)
            return self._edited(path, old, new, f"Edited {path}", limit)
        if command == "insert":
            line = req.get("insert_line")
            if line is None:
                raise Fail("bad_request", "insert needs insert_line (0 inserts at the top)")
            old = _read_text(path)
            lines = old.splitlines(True)
            n = int(line)
            if n < 0 or n > len(lines):
                raise Fail("bad_range", f"insert_line {n} is outside 0..{len(lines)}")
            text = str(req.get("new_str") or "")
            if text and not text.endswith("\n"):
                text += "\n"
            if n > 0 and lines and not lines[n - 1].endswith("\n"):
                lines[n - 1] += "\n"
            new = "".join([*lines[:n], text, *lines[n:]])
            self._remember(path)
            _write_text(path, new)
            return self._edited(path, old, new, f"Inserted into {path} after line {n}", limit)
        if command == "undo":
            stack = self.history.get(path)
            if not stack:
                raise Fail("nothing_to_undo", f"no edit of {path} to undo")
            previous = stack.pop()
            current = _read_text(path) if os.path.exists(path) else ""
            if previous is None:
                os.unlink(path)
                return self._edited(path, current, "", f"Undid the creation of {path}", limit)
            _write_text(path, previous)
            return self._edited(path, current, previous, f"Undid the last edit of {path}", limit)
        raise Fail(
            "bad_request",
            f"unknown edit command {command!r}; use view, create, str_replace, insert or undo",
        )

    def _view(self, path: str, req: dict[str, Any], limit: int) -> dict[str, Any]:
        if os.path.isdir(path):
            entries: list[str] = []
            for root, dirs, files in os.walk(path):
                depth = root[len(path) :].count(os.sep)
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                if depth >= 2:
                    dirs[:] = []
                entries.extend(os.path.join(root, d) + "/" for d in dirs)
                entries.extend(
                    os.path.join(root, f) for f in sorted(files) if not f.startswith(".")
                )
            listing = "\n".join(sorted(entries))
            return {
                "ok": True,
                "path": path,
                "content": cut_middle("", 0, listing, limit),
                "diff": "",
            }
        text = _read_text(path)
        lines = text.splitlines()
        rng = req.get("view_range") or [1, -1]
        start, end = int(rng[0]), int(rng[1])
        end = len(lines) if end == -1 else min(end, len(lines))
        if start < 1 or (lines and start > len(lines)) or end < start - 1:
            raise Fail("bad_range", f"view_range {rng} is outside 1..{len(lines)}")
        numbered = "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(start, end + 1))
        return {"ok": True, "path": path, "content": cut_middle("", 0, numbered, limit), "diff": ""}

    def _remember(self, path: str) -> None:
        previous = _read_text(path) if os.path.isfile(path) else None
        stack = self.history.setdefault(path, [])
        stack.append(previous)
        del stack[:-10]

    @staticmethod
    def _edited(path: str, old: str, new: str, message: str, limit: int) -> dict[str, Any]:
        import difflib

        diff = "".join(
            difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a{path}", f"b{path}")
        )
        return {
            "ok": True,
            "path": path,
            "content": message,
            "diff": cut_middle("", 0, diff, limit),
        }


# The most a file operation reads into memory: the sandbox's memory is the agent's, and a file
# read whole (then cut for the answer) must not be what exhausts it.
READ_MAX_BYTES = 32 << 20


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _open_regular(path: str, flags: int) -> int:
    """A descriptor of the regular file at `path`, or a clear Fail.

    Opened without blocking (a FIFO with no other end would wait for ever) and checked with
    fstat before a byte moves: devices, FIFOs and sockets are refused, never read or written.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        raise Fail("file_not_found", f"{path} does not exist") from None
    except IsADirectoryError:
        raise Fail("is_a_directory", f"{path} is a directory") from None
    except PermissionError:
        raise Fail("permission_denied", f"permission denied: {path}") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise Fail(
                "not_a_regular_file",
                f"{path} is a FIFO or socket, not a regular file; use a command for it",
            ) from None
        if exc.errno == errno.EROFS:
            raise Fail("permission_denied", f"read-only file system: {path}") from None
        raise Fail("io_error", f"{path}: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        os.set_blocking(fd, True)
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise Fail("is_a_directory", f"{path} is a directory")
    raise Fail(
        "not_a_regular_file",
        f"{path} is a {_file_kind(mode)}, not a regular file; use a command for it",
    )


def _read_text(path: str) -> str:
    fd = _open_regular(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        data = f.read(READ_MAX_BYTES + 1)  # bounded even if the file grows meanwhile
    if len(data) > READ_MAX_BYTES:
        raise Fail(
            "file_too_large",
            f"{path} is larger than the {READ_MAX_BYTES:,} bytes a file operation reads; look "
            "at parts of it with a command (head, tail, sed -n 'A,Bp', grep)",
        )
    if b"\x00" in data[:8192]:
        raise Fail("binary_file", f"{path} looks like a binary file ({len(data)} bytes)")
    return data.decode("utf-8", "replace")


def _write_text(path: str, content: str) -> None:
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
    except PermissionError:
        raise Fail("permission_denied", f"permission denied: {path}") from None
    except OSError as exc:
        raise Fail("io_error", f"{path}: {exc.strerror or exc}") from None
    # Truncated only once it is known to be a regular file.
    fd = _open_regular(path, os.O_WRONLY | os.O_CREAT)
    try:
        with os.fdopen(fd, "wb") as f:
            f.truncate(0)
            f.write(content.encode("utf-8"))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            note = _space_note("No space left on device")
            raise Fail("no_space", f"{path}: no space left on the device {note}".strip()) from None
        raise Fail("io_error", f"{path}: {exc.strerror or exc}") from None


# --------------------------------------------------------------------------- dispatch

PYTHON = PythonSession()


class Responder:
    """Writes one JSON line per response; the lock keeps lines whole across threads."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.stream = sys.stdout.buffer

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8", "replace")
        with self.lock:
            self.stream.write(data)
            self.stream.flush()


def _worker(
    jobs: queue.Queue[dict[str, Any]], handler: Any, responder: Responder, warmup: Any = None
) -> None:
    if warmup is not None:
        try:
            warmup()
        except Exception as exc:  # retried by the first request
            log(f"warm-up failed: {exc}")
    while True:
        req = jobs.get()
        rid = req.get("id")
        try:
            answer = handler(req)
        except Fail as exc:
            answer = {"ok": False, "code": exc.code, "error": str(exc)}
        except Exception as exc:
            import traceback

            log(f"request {rid} failed: {traceback.format_exc()}")
            answer = {
                "ok": False,
                "code": "executor_error",
                "error": f"{type(exc).__name__}: {exc}",
            }
        answer["id"] = rid
        responder.send(answer)


def _harden_self() -> None:
    # Not dumpable: the sandbox user's own processes cannot open /proc/<executor>/fd/* (its
    # pipes to the channel's holder, deploy/sandbox/holder.py) to read or forge protocol
    # traffic, nor ptrace it.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def _ping_id(line: bytes) -> str | None:
    """The id of a ping request, read without the json module (not loaded yet at boot)."""
    if b'"op": "ping"' not in line and b'"op":"ping"' not in line:
        return None
    for key in (b'"id": "', b'"id":"'):
        start = line.find(key)
        if start >= 0:
            start += len(key)
            end = line.find(b'"', start)
            rid = line[start:end]
            if end > start and rid.isascii() and b"\\" not in rid:
                return rid.decode()
    return None


class Dispatcher:
    """Routes request lines; until the sessions are loaded it answers pings and holds the rest.

    The same lock orders held and new lines, so requests keep their order across the switch.
    """

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.write_lock = _thread.allocate_lock()
        self.held: list[bytes] = []
        self.routes: dict[str, Any] | None = None
        self.responder: Responder | None = None

    def write(self, data: bytes) -> None:
        with self.write_lock:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()

    def feed(self, line: bytes) -> None:
        with self.lock:
            if self.routes is None:
                rid = _ping_id(line)
                if rid is None:
                    self.held.append(line)
                else:
                    self.write(
                        b'{"id": "'
                        + rid.encode()
                        + b'", "ok": true, "pid": '
                        + str(os.getpid()).encode()
                        + b', "protocol": '
                        + str(PROTOCOL).encode()
                        + b', "booting": true}\n'
                    )
                return
            self._route(line)

    def ready(self, routes: dict[str, Any], responder: Responder) -> None:
        with self.lock:
            self.routes, self.responder = routes, responder
            for line in self.held:
                self._route(line)
            self.held.clear()

    def _route(self, raw: bytes) -> None:
        assert self.routes is not None and self.responder is not None
        try:
            req = json.loads(raw)
            if not isinstance(req, dict):
                raise ValueError("a request is a JSON object")
        except ValueError as exc:
            self.responder.send({"id": None, "ok": False, "code": "bad_request", "error": str(exc)})
            return
        op = str(req.get("op"))
        if op == "ping":
            self.responder.send(
                {
                    "id": req.get("id"),
                    "ok": True,
                    "pid": os.getpid(),
                    "protocol": PROTOCOL,
                    "uptime_s": time.monotonic() - STARTED,
                }
            )
        elif op in self.routes:
            self.routes[op].put(req)
        else:
            self.responder.send(
                {
                    "id": req.get("id"),
                    "ok": False,
                    "code": "bad_request",
                    "error": f"unknown op {op!r}",
                }
            )


def _boot(dispatcher: Dispatcher) -> None:
    """Load the modules, start the workers (the shell first), then take over from the boot."""
    try:
        _load_modules()
        # Before any of the agent's code can run (the shell starts below).
        _harden_self()
        os.makedirs(os.environ.get("HOME", "/tmp/home"), exist_ok=True)
        responder = Responder(dispatcher.write_lock)
        bash = BashSession()
        files = Files()

        # Workers exist before any user code runs: under a fork bomb no thread could start.
        # The shell starts in its worker; commands queue behind it.
        routes: dict[str, queue.Queue[dict[str, Any]]] = {}
        for ops, handler, warmup in (
            (("bash",), bash.run, bash.start),
            (("python",), PYTHON.run, None),
            (("read", "write", "edit"), lambda r: getattr(files, r["op"])(r), None),
            (("chunk",), files.chunk, None),
        ):
            jobs: queue.Queue[dict[str, Any]] = queue.Queue()
            threading.Thread(
                target=_worker, args=(jobs, handler, responder, warmup), daemon=True
            ).start()
            for op in ops:
                routes[op] = jobs
        dispatcher.ready(routes, responder)
    except BaseException as exc:  # without its machinery the executor is useless: exit loudly
        log(f"boot failed: {type(exc).__name__}: {exc}")
        os._exit(70)


def main() -> None:
    dispatcher = Dispatcher()
    _thread.start_new_thread(_boot, (dispatcher,))
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            break
        dispatcher.feed(line)
    log("stdin closed; exiting")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--kernel":
        kernel_main(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
