"""The `python` operation: a separate Python process whose globals persist between cells.

PythonSession is the executor's side; kernel_main is the loop of the Python process itself,
which runs this module from the package (`_KERNEL`), with site-packages, unlike the executor.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

from .config import DEFAULT_LIMIT, DEFAULT_TIMEOUT_S, WORKSPACE
from .output import Captured, space_note
from .processes import child_setup, oom_kills, request_env, user_env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from shared.sandbox_protocol.messages import PythonReply, PythonRequest

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_PARENT, _NAME = os.path.split(_PACKAGE)
# The Python process's program: kernel_main, imported from this package. Its parent directory
# takes the first place on sys.path, where a script's own directory would be (`-c` puts "" there,
# the current directory, unless safe_path): the path user cells see is the one they saw when
# the executor was a single file run as the script.
_KERNEL = (
    "import sys\n"
    f"if sys.flags.safe_path: sys.path.insert(0, {_PARENT!r})\n"
    f"else: sys.path[0] = {_PARENT!r}\n"
    f"from {_NAME}.kernel import kernel_main\n"
    "kernel_main(int(sys.argv[1]), int(sys.argv[2]))\n"
)


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
                [sys.executable, "-u", "-c", _KERNEL, str(to_kernel_r), str(from_kernel_w)],
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=out_w,
                cwd=cwd,
                env=user_env(),
                pass_fds=(to_kernel_r, from_kernel_w),
                start_new_session=True,
                preexec_fn=lambda: child_setup(False),
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

    def run(self, req: PythonRequest) -> PythonReply:
        limit = int(req.get("limit") or DEFAULT_LIMIT)
        timeout_s = float(req.get("timeout_s") or DEFAULT_TIMEOUT_S)
        env = request_env(req)
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
            status, result = self._interrupt(out, notes, timeout_s)
        if status == "died":
            result = {"rc": self._died(out, notes, before_oom)}
        output = out.render()
        return {
            "ok": True,
            "output": output,
            "exit_code": int(result.get("rc", 1)),
            "timed_out": timed_out,
            "note": "\n".join(n for n in (*notes, space_note(output)) if n),
            **out.kept(),
        }

    def _interrupt(
        self, out: Captured, notes: list[str], timeout_s: float
    ) -> tuple[str, dict[str, Any]]:
        """Stop the cell that timed out: SIGINT (KeyboardInterrupt), then kill the process."""
        assert self.proc is not None
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
        return status, result

    def _died(self, out: Captured, notes: list[str], before_oom: int | None) -> int:
        """The Python process ended during the cell: say why, and its exit code (128 + signal)."""
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
        return rc if rc >= 0 else 128 - rc

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
    import ast
    import builtins
    import linecache
    import traceback

    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
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
