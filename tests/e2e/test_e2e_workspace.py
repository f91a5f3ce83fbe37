"""A task on a repository, and its workspace in and out (issue 11, parts 1, 2 and 5), on the
real stack: gateway, controller, reasoner (scripted LLM), security, runtime (Docker), storage.
One test is the issue's whole demonstration: a repository with a failing test fixed by a task
that uses a secret, the diff, the signed webhook, the secret in no event.

The repository is served from this machine by `git daemon` on 127.0.0.1, and the webhook
receiver listens there too (the stack allows private webhook targets): nothing leaves it.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import subprocess
import tarfile
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from e2e_helpers import Receiver, create_task, log_of, verify_signature, wait_for_state  # type: ignore[import-not-found]

from tools.api_access import auth_headers, issue_key
from tools.procs import free_port
from tools.stack import Stack, StackConfig, running

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "scripts" / "workspace.json"
UPLOAD_LIMIT = 1 << 20  # the gateway's, for this stack
DOWNLOAD_LIMIT = 3 << 20
EXTRACT_LIMIT = 8 << 20  # the runtime's
RETENTION_S = 15  # long enough for a test's reads after its task ended


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A repository whose test fails (calc.add subtracts), with an AGENTS.md, served by
    `git daemon` on loopback; (its URL, the commit of its main branch)."""
    root = tmp_path_factory.mktemp("repos")
    project = root / "calc"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (project / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (project / "AGENTS.md").write_text("Run the tests with `python -m pytest -q`.\n")
    (project / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "calc with a bug")
    _git(project, "tag", "v1")
    _git(project, "checkout", "-qb", "feature")
    (project / "feature.txt").write_text("only on the feature branch\n")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "feature")
    _git(project, "checkout", "-q", "main")
    commit = _git(project, "rev-parse", "HEAD")
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
        deadline = time.monotonic() + 10
        while True:
            probe = subprocess.run(
                ["git", "ls-remote", f"git://127.0.0.1:{port}/calc"],
                capture_output=True,
                timeout=10,
            )
            if probe.returncode == 0:
                break
            assert time.monotonic() < deadline, probe.stderr
            time.sleep(0.2)
        yield f"git://127.0.0.1:{port}/calc", commit
    finally:
        daemon.terminate()
        daemon.wait(10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("workspace"))
    config = StackConfig.isolated(
        run_dir,
        llm_script=SCRIPT,
        extra_env={
            "DECKHANDS_POOL_MIN_IDLE": "1",
            "DECKHANDS_WORKSPACE_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT),
            "DECKHANDS_WORKSPACE_MAX_DOWNLOAD_BYTES": str(DOWNLOAD_LIMIT),
            "DECKHANDS_WORKSPACE_MAX_EXTRACT_BYTES": str(EXTRACT_LIMIT),
            "DECKHANDS_WORKSPACE_RETENTION_S": str(RETENTION_S),
            # The runtime's upkeep (reconciliation, retention) runs this often.
            "DECKHANDS_POOL_HEALTH_INTERVAL_S": "1",
            "DECKHANDS_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",  # the receiver is on loopback
            # The git servers are on loopback, which the address policy refuses otherwise.
            "DECKHANDS_REPOSITORY_ALLOWED_HOSTS": '["127.0.0.1"]',
        },
    )
    with running(config) as stack:
        yield stack


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=60
    ) as client:
        yield client


def _tar(files: dict[str, bytes], *, gz: bool = False, extra: list[tarfile.TarInfo] = ()) -> bytes:  # type: ignore[assignment]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as tar:
        for info in extra:
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_task_fixes_a_repository_and_its_diff_shows_the_fix(
    http: httpx.Client, served: tuple[str, str]
) -> None:
    url, commit = served
    task_id = create_task(http, task="repo-fix: make the tests pass", repository={"url": url})
    view = wait_for_state(http, task_id, "FINISHED", "ERROR")
    assert view["state"] == "FINISHED", view
    assert "1 passed" in view["result"]["final_message"], view
    log = log_of(http, task_id)
    first_run = next(e for e in log if e["kind"] == "run_output")
    # The first action found the checkout: the commit, and the failing test.
    assert commit[:7] in first_run["content"] and "1 failed" in first_run["content"], first_run

    diff = http.get(f"/v1/tasks/{task_id}/workspace/diff")
    assert diff.status_code == 200, diff.text
    assert "--- a/calc.py" in diff.text and "+++ b/calc.py" in diff.text, diff.text
    assert "-    return a - b" in diff.text and "+    return a + b" in diff.text, diff.text
    assert "__pycache__" not in diff.text  # .gitignore holds

    fixed = http.get(f"/v1/tasks/{task_id}/workspace", params={"path": "calc.py"})
    assert fixed.status_code == 200 and fixed.content == b"def add(a, b):\n    return a + b\n"

    tree = http.get(f"/v1/tasks/{task_id}/workspace")
    assert tree.status_code == 200 and tree.headers["content-type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(tree.content), mode="r:gz") as tar:
        names = set(tar.getnames())
        assert {"workspace/calc.py", "workspace/test_calc.py", "workspace/.git/HEAD"} <= names
        head = tar.extractfile("workspace/.git/HEAD")
        assert head is not None and head.read().strip() == b"ref: refs/heads/main"

    # The repository's instructions joined the system prompt, and the log says so.
    used = [e for e in log if e.get("instructions")]
    assert used and used[0]["instructions"]["path"] == "AGENTS.md", log


def test_a_task_with_a_secret_fixes_a_repository_and_a_signed_webhook_says_so(
    http: httpx.Client, served: tuple[str, str]
) -> None:
    """Issue 11's demonstration in one task: checkout, a secret used and printed, the fix, the
    passing test, the diff, one signed FINISHED notification, the value in no event."""
    url, commit = served
    value = "dpl-" + uuid.uuid4().hex
    signing_key = "whsec-" + uuid.uuid4().hex
    for name, secret in (("DEPLOY_TOKEN", value), ("WEBHOOK_KEY", signing_key)):
        stored = http.put(f"/v1/secrets/{name}", json={"value": secret})
        assert stored.status_code in (200, 201), stored.text
    hook = Receiver()
    try:
        task_id = create_task(
            http,
            task="repo-secret-fix: make the tests pass, then deploy",
            repository={"url": url},
            secrets=["DEPLOY_TOKEN"],
            webhook={"url": hook.url, "signing_secret": "WEBHOOK_KEY"},
        )
        view = wait_for_state(http, task_id, "FINISHED", "ERROR")
        assert view["state"] == "FINISHED", view
        # The last command ran the test only if the secret was in its environment.
        assert "1 passed" in view["result"]["final_message"], view
        diff = http.get(f"/v1/tasks/{task_id}/workspace/diff")  # before the retention ends
        assert diff.status_code == 200, diff.text
        assert "--- a/calc.py" in diff.text and "+++ b/calc.py" in diff.text, diff.text
        assert "-    return a - b" in diff.text and "+    return a + b" in diff.text, diff.text

        hook.wait_for(1)
        time.sleep(2.0)  # a second notification would come now
    finally:
        hook.close()
    assert len(hook.requests) == 1, hook.requests
    headers, body, _, _ = hook.requests[0]
    assert verify_signature(signing_key, headers["Deckhands-Signature"], body), headers
    assert not verify_signature(value, headers["Deckhands-Signature"], body)
    payload = json.loads(body)
    assert payload["type"] == "task.finished" and headers["Deckhands-Event"] == "task.finished"
    assert payload["task"]["id"] == task_id and payload["task"]["state"] == "FINISHED", payload
    assert "1 passed" in payload["task"]["final_message"], payload
    deadline = time.monotonic() + 30
    while True:  # the delivery log is written once the receiver has answered
        attempts = http.get(f"/v1/tasks/{task_id}/webhooks").json()["attempts"]
        if attempts or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [(a["attempt"], a["status_code"], a["outcome"]) for a in attempts] == [
        (1, 200, "delivered")
    ], attempts

    log = log_of(http, task_id)
    first_run = next(e for e in log if e["kind"] == "run_output")
    # The checkout was there (its commit, the failing test), and the printed secret redacted.
    assert "deploying with <secret:DEPLOY_TOKEN>" in first_run["content"], first_run
    assert commit[:7] in first_run["content"] and "1 failed" in first_run["content"], first_run
    trajectory = http.get(f"/v1/tasks/{task_id}/trajectory")
    assert trajectory.status_code == 200, trajectory.text
    assert "<secret:DEPLOY_TOKEN>" in trajectory.text
    for where, text in (
        ("events", json.dumps(log)),
        ("trajectory", trajectory.text),
        ("task", json.dumps(view)),
        ("webhook body", body.decode()),
        ("diff", diff.text),
    ):
        assert value not in text, f"the secret's value is in the {where}"
        assert signing_key not in text, f"the signing key is in the {where}"


def test_a_ref_is_checked_out_and_a_bad_repository_ends_the_task_with_the_reason(
    http: httpx.Client, served: tuple[str, str]
) -> None:
    url, _ = served
    branch = create_task(
        http, task="checkout-only: the feature branch", repository={"url": url, "ref": "feature"}
    )
    tag = create_task(http, task="checkout-only: the tag", repository={"url": url, "ref": "v1"})
    missing_ref = create_task(
        http, task="checkout-only: no such ref", repository={"url": url, "ref": "nope"}
    )
    missing_repo = create_task(
        http, task="checkout-only: no such repo", repository={"url": url + "-missing"}
    )
    view = wait_for_state(http, branch, "FINISHED", "ERROR")
    assert view["state"] == "FINISHED" and "feature.txt" in view["result"]["final_message"]
    view = wait_for_state(http, tag, "FINISHED", "ERROR")
    assert view["state"] == "FINISHED" and "feature.txt" not in view["result"]["final_message"]
    for task_id, why in (
        (missing_ref, "no branch, tag or commit 'nope'"),
        (missing_repo, "could not be fetched: not a git repository or not found"),
    ):
        view = wait_for_state(http, task_id, "FINISHED", "ERROR")
        assert view["state"] == "ERROR", view
        assert "could not be checked out" in view["reason"] and why in view["reason"], view

    for repository, named in (
        ({"url": "file:///etc"}, "scheme"),
        ({"url": "https://user:pw@example.com/x.git"}, "credentials"),
        ({"url": "https://example.com/x.git", "ref": "--upload-pack=x"}, "ref"),
        ({"url": "https://example.com/x.git", "token_secret": "NOPE"}, "token_secret"),
    ):
        refused = http.post("/v1/tasks", json={"task": "x", "repository": repository})
        assert refused.status_code == 422 and named in refused.text, refused.text


def test_upload_download_and_their_refusals(http: httpx.Client, stack: Stack) -> None:
    task_id = create_task(http, task="wait-here: a task that waits for an upload")
    wait_for_state(http, task_id, "AWAITING_USER_INPUT")
    base = f"/v1/tasks/{task_id}/workspace"

    # A tar into the workspace, a zip under a directory, one file.
    up = http.put(base, content=_tar({"notes/readme.txt": b"hello from the upload\n"}))
    assert up.status_code == 200 and up.json() == {"files": 1}, up.text
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("a.txt", "zipped\n")
    up = http.put(
        base,
        params={"path": "unzipped"},
        content=packed.getvalue(),
        headers={"content-type": "application/zip"},
    )
    assert up.status_code == 200, up.text
    up = http.put(base, params={"path": "/workspace/one/file.bin"}, content=b"\x00\x01binary")
    assert up.status_code == 200, up.text
    for path, body in (
        ("notes/readme.txt", b"hello from the upload\n"),
        ("unzipped/a.txt", b"zipped\n"),
        ("one/file.bin", b"\x00\x01binary"),
        ("ready.txt", b"ready\n"),  # written by the agent's command
    ):
        got = http.get(base, params={"path": path})
        assert got.status_code == 200 and got.content == body, (path, got.text)

    # The diff is against the uploaded tree: nothing changed since.
    diff = http.get(f"{base}/diff")
    assert diff.status_code == 200 and "notes/readme.txt" not in diff.text, diff.text

    # Paths that leave /workspace, archives that would, and what is not a file.
    link = tarfile.TarInfo("escape")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc"
    dev = tarfile.TarInfo("null")
    dev.type = tarfile.CHRTYPE
    for params, content, named in (
        ({"path": "../outside"}, b"x", ".."),
        ({"path": "/etc/passwd"}, b"x", "outside /workspace"),
        ({}, _tar({"../evil.txt": b"x"}), ".."),
        ({}, _tar({"/etc/evil.txt": b"x"}), "outside /workspace"),
        ({}, _tar({"escape/evil.txt": b"x"}, extra=[link]), "symbolic link"),
        ({}, _tar({}, extra=[dev]), "special file"),
        ({}, b"this is no archive", "not a tar"),
    ):
        refused = http.put(base, params=params, content=content)
        assert refused.status_code == 400 and named in refused.text, (params, refused.text)
    for params, named in (
        ({"path": "../../etc/passwd"}, ".."),
        ({"path": "/etc/passwd"}, "outside /workspace"),
        ({"path": "notes"}, "directory"),
        ({"path": "missing.txt"}, "no missing.txt"),
    ):
        refused = http.get(base, params=params)
        assert refused.status_code in (400, 404) and named in refused.text, refused.text
    # A symbolic link the agent could have made, leading out: refused, not followed.
    http.put(base, content=_tar({}, extra=[link]))
    refused = http.get(base, params={"path": "escape/passwd"})
    assert refused.status_code == 400 and "symbolic link" in refused.text, refused.text
    # An upload through it replaces the link with a directory instead of writing through it.
    up = http.put(base, params={"path": "escape/inside.txt"}, content=b"stays in\n")
    assert up.status_code == 200, up.text
    assert http.get(base, params={"path": "escape/inside.txt"}).content == b"stays in\n"

    # Sizes: the body (gateway), what it extracts to (runtime), what a download holds.
    too_big = http.put(base, params={"path": "big.bin"}, content=b"x" * (UPLOAD_LIMIT + 1))
    assert too_big.status_code == 413 and "DECKHANDS_WORKSPACE_MAX_UPLOAD_BYTES" in too_big.text
    bomb = _tar({"zeros.bin": b"\0" * (EXTRACT_LIMIT + 1)}, gz=True)
    assert len(bomb) < UPLOAD_LIMIT
    refused = http.put(base, content=bomb, headers={"content-type": "application/gzip"})
    assert refused.status_code == 413 and "extracted" in refused.text, refused.text
    large = _tar({"large.bin": b"\0" * (DOWNLOAD_LIMIT + 1)}, gz=True)
    assert http.put(base, content=large).status_code == 200
    refused = http.get(base, params={"path": "large.bin"})
    assert refused.status_code == 413 and "limit" in refused.text, refused.text
    tree = http.get(base)  # the tree compresses below the limit
    assert tree.status_code == 200
    assert len(gzip.decompress(tree.content)) > DOWNLOAD_LIMIT

    # Another tenant's task answers 404, on every workspace route.
    other = issue_key(stack.config.gateway_url, stack.admin_api_key, "ws-other", name="e2e")
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=auth_headers(other), timeout=30
    ) as stranger:
        for method, path, params in (
            ("GET", base, {}),
            ("GET", base, {"path": "notes/readme.txt"}),
            ("GET", f"{base}/diff", {}),
            ("PUT", base, {"path": "x.txt"}),
        ):
            answer = stranger.request(method, path, params=params, content=b"x")
            assert answer.status_code == 404, (method, path, answer.text)
        missing = stranger.get("/v1/tasks/does-not-exist/workspace")
        assert missing.status_code == 404

    # The agent sees the upload and changes it; the diff shows its change, not the upload.
    assert http.post(f"/v1/tasks/{task_id}/messages", json={"content": "done"}).status_code == 202
    view = wait_for_state(http, task_id, "FINISHED", "ERROR")
    message = view["result"]["final_message"]
    assert view["state"] == "FINISHED" and "hello from the upload" in message, view
    assert "changed by the agent" in message, view
    diff = http.get(f"{base}/diff")
    assert diff.status_code == 200, diff.text
    assert "+changed by the agent" in diff.text and "+hello" not in diff.text, diff.text
    assert ".deckhands" not in diff.text and "zeros.bin" not in diff.text


def test_an_ended_tasks_workspace_is_kept_then_gone(http: httpx.Client) -> None:
    task_id = create_task(http, task="done-at-once: write a file and finish")
    wait_for_state(http, task_id, "FINISHED")
    base = f"/v1/tasks/{task_id}/workspace"
    kept = http.get(base, params={"path": "kept.txt"})
    assert kept.status_code == 200 and kept.content == b"kept\n", kept.text
    up = http.put(base, params={"path": "late.txt"}, content=b"after the end\n")
    assert up.status_code == 200, up.text
    deadline = time.monotonic() + RETENTION_S + 30
    while True:
        answer = http.get(base, params={"path": "kept.txt"})
        if answer.status_code == 410:
            break
        assert answer.status_code == 200, answer.text
        assert time.monotonic() < deadline, "the workspace was never removed"
        time.sleep(0.5)
    assert "gone" in answer.text
    for method, path in (("GET", base), ("GET", f"{base}/diff"), ("PUT", base)):
        answer = http.request(method, path, params={"path": "x"}, content=b"x")
        assert answer.status_code == 410, (method, path, answer.text)


class _Recorder(BaseHTTPRequestHandler):
    """A git server that wants a token: records the Authorization header, refuses."""

    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization", ""))
        self.send_response(403)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_token_secret_reaches_the_git_server_and_no_event(http: httpx.Client) -> None:
    token = "glpat-" + "T0k3n" * 6
    stored = http.put("/v1/secrets/REPO_TOKEN", json={"value": token})
    assert stored.status_code in (200, 201), stored.text
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/private.git"
        task_id = create_task(
            http,
            task="checkout-only: a private repository",
            repository={"url": url, "token_secret": "REPO_TOKEN"},
        )
        view = wait_for_state(http, task_id, "FINISHED", "ERROR")
    finally:
        server.shutdown()
    assert view["state"] == "ERROR" and "could not be checked out" in view["reason"], view
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    assert f"Basic {basic}" in _Recorder.seen, _Recorder.seen
    assert token not in json.dumps(view) and token not in json.dumps(log_of(http, task_id))


def test_a_fork_before_the_first_action_starts_with_the_checked_out_repository(
    http: httpx.Client, served: tuple[str, str]
) -> None:
    url, commit = served
    parent = create_task(http, task="repo-fix: make the tests pass", repository={"url": url})
    assert wait_for_state(http, parent, "FINISHED", "ERROR")["state"] == "FINISHED"
    # The checkout is the workspace the task was created with: its checkpoint is at seq 1.
    deadline = time.monotonic() + 30
    while not any(e.get("action_seq") == 1 for e in log_of(http, parent)):
        assert time.monotonic() < deadline, log_of(http, parent)
        time.sleep(0.3)
    [at_one] = [e for e in log_of(http, parent) if e.get("action_seq") == 1]
    assert at_one["kind"] == "workspace_checkpoint" and at_one["checkpoint"] == f"{parent}/1"

    made = http.post(f"/v1/tasks/{parent}/fork", json={"at": 1})
    assert made.status_code == 202, made.text
    assert made.json()["checkpoint"] == f"{parent}/1", made.json()
    [fork] = [f["id"] for f in made.json()["forks"]]
    view = wait_for_state(http, fork, "FINISHED", "ERROR")
    assert view["state"] == "FINISHED" and "1 passed" in view["result"]["final_message"], view
    # Its first command found the repository as checked out: the commit, the failing test.
    first_run = next(
        e for e in log_of(http, fork) if e["kind"] == "run_output" and not e.get("inherited_from")
    )
    assert commit[:7] in first_run["content"] and "1 failed" in first_run["content"], first_run
