"""The tasks' starting files, served to the stack as git repositories by `git daemon` on
127.0.0.1: a task created with `repository.url` = git://127.0.0.1:<port>/<task> has them in
/workspace (committed, `.git` included) before its first action, fetched by the runtime. Nothing
leaves the machine, and no upload can race the agent's first command."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..procs import free_port
from .tasks import EvalTask

__all__ = ["RepoServer", "serve_repositories"]

_GIT = ["git", "-c", "user.name=deckhands-eval", "-c", "user.email=eval@deckhands.invalid"]


def _git(cwd: Path, *args: str) -> None:
    subprocess.run([*_GIT, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


class RepoServer:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port

    def url(self, task: EvalTask) -> str | None:
        """The repository of `task`'s starting files; None when it has none."""
        return f"git://127.0.0.1:{self.port}/{task.id}" if task.files else None


def _make_repo(root: Path, task: EvalTask) -> None:
    repo = root / task.id
    for rel, content in task.files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    (repo / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", f"starting files of {task.id}")


@contextmanager
def serve_repositories(tasks: list[EvalTask]) -> Iterator[RepoServer]:
    """Serve a repository of each task that has starting files, for the block's duration."""
    with tempfile.TemporaryDirectory(prefix="deckhands-eval-repos-") as tmp:
        root = Path(tmp)
        for task in tasks:
            if task.files:
                _make_repo(root, task)
        port = free_port()
        daemon = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                f"--base-path={root}",
                "--listen=127.0.0.1",
                f"--port={port}",
                str(root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            probe = next((t for t in tasks if t.files), None)
            deadline = time.monotonic() + 15
            while probe is not None:
                done = subprocess.run(
                    ["git", "ls-remote", f"git://127.0.0.1:{port}/{probe.id}"],
                    capture_output=True,
                    timeout=10,
                )
                if done.returncode == 0:
                    break
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise RuntimeError(
                        "git daemon did not serve the tasks' repositories: "
                        + done.stderr.decode(errors="replace")[-300:]
                    )
                time.sleep(0.2)
            yield RepoServer(root, port)
        finally:
            daemon.terminate()
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(10)
