"""Issue 24, findings 1 and 5: the containers that run git over a task's files, and archives.

A tenant controls the files a workspace helper reads: an upload may carry a git directory
(or deckhands' own `.deckhands/`), and the agent may write `.git/config`. Its git settings can
name commands (a clean filter, a textconv, a diff driver, `diff.external`, `core.fsmonitor`,
`core.pager`); before the fix `GET .../workspace/diff` ran them in a helper that, on a gVisor
node, ran under runc: the tenant's command on the host's kernel. Each attack here is made
from outside, through the API, on the real stack; none of the planted commands may run
(each would print a marker, `...-42`, that its source text does not hold, or kill git), and
every helper runs under the stack's OCI runtime (a second stack under gVisor where runsc is
registered).

A damaged archive (a truncated tar, a gzip cut short, a zip with a bad CRC-32) and an
over-long or over-deep path are a quick 400 naming the problem, with no engine detail.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from conftest import SCRIPT, Tenant, tar  # type: ignore[import-not-found]

from tools.api_access import auth_headers, issue_key
from tools.stack import Stack, StackConfig, running

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

MARKERS = ("FILTER-42", "TEXTCONV-42", "DRIVER-42", "EXTERNAL-42", "PAGER-42", "FSMON-42")
# Settings a repository's config may hold that name a command, each printing a marker if run.
EVIL_CONFIG = """
[filter "evil"]
\tclean = sh -c 'echo FILTER-$((40+2)); cat /proc/version'
\tsmudge = sh -c 'echo FILTER-$((40+2))'
\trequired = true
[diff "evil"]
\ttextconv = sh -c 'echo TEXTCONV-$((40+2))'
\tcommand = sh -c 'echo DRIVER-$((40+2))'
[diff]
\texternal = sh -c 'echo EXTERNAL-$((40+2))'
[core]
\tfsmonitor = sh -c 'echo FSMON-$((40+2)) >&2; kill -9 $PPID'
\tpager = sh -c 'echo PAGER-$((40+2))'
\thooksPath = /workspace/hooks
[include]
\tpath = /workspace/more.cfg
"""


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=30,
    )


def _tar_of(root: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(root.rglob("*")):
            archive.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buffer.getvalue()


def _evil_repository(root: Path) -> bytes:
    """A tar of a repository whose config names commands, whose attributes name them for
    data.txt, with data.txt changed since its commit (so the diff reads it)."""
    root.mkdir()
    (root / ".gitattributes").write_text("*.txt filter=evil diff=evil\n")
    (root / "data.txt").write_text("before\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "data")
    (root / "data.txt").write_text("after\n")
    (root / "new.txt").write_text("untracked\n")
    with (root / ".git" / "config").open("a") as config:
        config.write(EVIL_CONFIG)
    (root / "more.cfg").write_text("[diff]\n\texternal = sh -c 'echo EXTERNAL-$((40+2))'\n")
    hooks = root / "hooks"
    hooks.mkdir()
    for hook in ("post-index-change", "reference-transaction", "fsmonitor-watchman"):
        (hooks / hook).write_text("#!/bin/sh\necho HOOK-$((40+2)) >&2; kill -9 $PPID\n")
        (hooks / hook).chmod(0o755)
    return _tar_of(root)


class HelperRuntimes:
    """The OCI runtime of every workspace helper created while it watches (Docker's events:
    a helper is inspected as it is created, before it can be removed)."""

    def __init__(self) -> None:
        self.client = docker.from_env(timeout=30)
        self.seen: list[str] = []
        self._events: Any = None
        self._thread: threading.Thread | None = None

    def _watch(self) -> None:
        for event in self._events:
            if event.get("Type") != "container" or event.get("Action") != "create":
                continue
            attrs = event.get("Actor", {}).get("Attributes", {})
            if attrs.get("deckhands.role") != "workspace-helper":
                continue
            try:
                info = self.client.api.inspect_container(event["id"])
            except docker.errors.NotFound:
                self.seen.append("gone before it could be inspected")
                continue
            self.seen.append(str(info["HostConfig"].get("Runtime")))

    def __enter__(self) -> HelperRuntimes:
        self._events = self.client.events(
            decode=True, filters={"type": "container", "event": "create"}
        )
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)  # the last event's inspection
        self._events.close()
        self.client.close()


def _waiting_task(tenant: Tenant) -> str:
    task_id = tenant.create(task="ask: a task that waits while its workspace is attacked")
    tenant.wait(task_id, "AWAITING_USER_INPUT")
    return task_id


def _assert_clean_diff(diff: httpx.Response, *, shows: str) -> None:
    assert diff.status_code == 200, diff.text  # git was not killed by a planted command
    for marker in (*MARKERS, "HOOK-42"):
        assert marker not in diff.text, (marker, diff.text)
    assert "Linux version" not in diff.text, diff.text
    assert shows in diff.text, diff.text


def test_an_uploaded_repositorys_settings_run_nothing(
    alpha: Tenant, tmp_path: Path, stack: Stack
) -> None:
    task_id = _waiting_task(alpha)
    base = f"/v1/tasks/{task_id}/workspace"
    with HelperRuntimes() as helpers:
        up = alpha.http.put(base, content=_evil_repository(tmp_path / "repo"))
        assert up.status_code == 200, up.text
        diff = alpha.http.get(f"{base}/diff")
    _assert_clean_diff(diff, shows="+after")
    assert "+untracked" in diff.text, diff.text
    # The upload's baseline is skipped (it has a .git) but its diff ran in a helper: under the
    # engine's default runtime here, as the stack's sandboxes are.
    assert helpers.seen and set(helpers.seen) <= {"runc", ""}, helpers.seen


def test_a_filter_the_agent_writes_into_git_config_never_runs(alpha: Tenant) -> None:
    task_id = alpha.create(task="git-config-attack: plant commands in .git/config")
    alpha.wait(task_id, "AWAITING_USER_INPUT")
    events = alpha.log(task_id)
    assert any("planted" in str(e) for e in events), events
    diff = alpha.http.get(f"/v1/tasks/{task_id}/workspace/diff")
    _assert_clean_diff(diff, shows="+after")


def test_an_upload_may_not_carry_deckhands_own_directory(alpha: Tenant, tmp_path: Path) -> None:
    task_id = _waiting_task(alpha)
    base = f"/v1/tasks/{task_id}/workspace"
    bare = tmp_path / "baseline.git"
    _git(tmp_path, "init", "-q", "--bare", str(bare))
    with (bare / "config").open("a") as config:
        config.write(EVIL_CONFIG)
    root = tmp_path / "tree"
    (root / ".deckhands").mkdir(parents=True)
    subprocess.run(["cp", "-R", str(bare), str(root / ".deckhands")], check=True, timeout=30)
    (root / ".gitattributes").write_text("*.txt filter=evil diff=evil\n")
    (root / "data.txt").write_text("x\n")
    for params, body in (
        ({}, _tar_of(root)),
        ({"path": ".deckhands"}, tar({"baseline.git/config": EVIL_CONFIG.encode()})),
        ({"path": ".deckhands/baseline.git/config"}, EVIL_CONFIG.encode()),
        ({"path": "/workspace/.deckhands/x"}, b"x"),
    ):
        refused = alpha.http.put(base, params=params, content=body)
        assert refused.status_code == 400, (params, refused.text)
        assert ".deckhands" in refused.json()["detail"], refused.text
    # Nothing of it was written.
    missing = alpha.http.get(base, params={"path": ".deckhands/baseline.git/config"})
    assert missing.status_code == 404, missing.text
    assert alpha.http.get(base, params={"path": "data.txt"}).status_code == 404

    # Clean uploads write the baseline (anew each time): the diff compares with the last.
    up = alpha.http.put(base, content=tar({".gitattributes": b"*.txt filter=evil diff=evil\n"}))
    assert up.status_code == 200, up.text
    up = alpha.http.put(base, content=tar({"data.txt": b"one\n"}))
    assert up.status_code == 200, up.text
    diff = alpha.http.get(f"{base}/diff")
    assert diff.status_code == 200 and diff.text == "", diff.text


def _damaged_archives() -> list[tuple[str, bytes, dict[str, str]]]:
    big = bytes(range(256)) * 4096  # 1 MiB that does not compress to nothing
    whole = tar({"a.bin": big, "b.txt": b"b\n"})
    gz = io.BytesIO()
    with tarfile.open(fileobj=gz, mode="w:gz") as archive:
        info = tarfile.TarInfo("a.bin")
        info.size = len(big)
        archive.addfile(info, io.BytesIO(big))
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("a.txt", "zipped " * 1000)
    zipped = bytearray(packed.getvalue())
    crc_at = zipped.index(b"PK\x01\x02") + 16  # the central directory's CRC-32
    zipped[crc_at : crc_at + 4] = b"\x00\x00\x00\x00"
    stored = io.BytesIO()
    with zipfile.ZipFile(stored, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("a.txt", "stored " * 1000)
    stored_bad = bytearray(stored.getvalue())
    stored_bad[40:50] = b"XXXXXXXXXX"  # the data, not the header: only the CRC-32 can tell
    zip_type = {"content-type": "application/zip"}
    return [
        ("a tar cut inside an entry's data", whole[: 512 + 300_000], {}),
        ("a tar.gz cut short", gz.getvalue()[: len(gz.getvalue()) // 2], {}),
        ("a tar.gz whose data is garbled", _garble(gz.getvalue()), {}),
        ("a zip whose CRC-32 is wrong", bytes(zipped), zip_type),
        ("a stored zip whose data was changed", bytes(stored_bad), zip_type),
        ("a zip cut short", packed.getvalue()[:60], zip_type),
    ]


def _garble(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x5A for b in data[middle : middle + 64]) + data[middle + 64 :]


def test_damaged_archives_are_a_quick_400(alpha: Tenant) -> None:
    task_id = _waiting_task(alpha)
    base = f"/v1/tasks/{task_id}/workspace"
    for what, body, headers in _damaged_archives():
        started = time.monotonic()
        answer = alpha.http.put(base, content=body, headers=headers)
        took = time.monotonic() - started
        assert answer.status_code == 400, (what, answer.status_code, answer.text)
        detail = answer.json()["detail"]
        assert "damaged" in detail or "cannot be read" in detail or "not a" in detail, (
            what,
            detail,
        )
        assert took < 10, (what, took)
    # Nothing of them was written, and the runtime still answers.
    assert alpha.http.get(base, params={"path": "a.bin"}).status_code == 404
    assert alpha.http.get(base, params={"path": "a.txt"}).status_code == 404
    up = alpha.http.put(base, content=tar({"ok.txt": b"ok\n"}))
    assert up.status_code == 200, up.text


def test_over_long_and_over_deep_paths_are_a_quick_400(alpha: Tenant) -> None:
    task_id = _waiting_task(alpha)
    base = f"/v1/tasks/{task_id}/workspace"
    for what, path in (
        ("a name of 300 characters", "a" * 300),
        ("2,100 levels", "/".join(["a"] * 2100)),
        ("a path of 5,000 bytes", "/".join(["b" * 200] * 25)),
    ):
        for method, params, body in (
            ("GET", {"path": path}, None),
            ("PUT", {"path": path}, b"x"),
            ("PUT", {}, tar({path: b"x"})),
        ):
            started = time.monotonic()
            answer = alpha.http.request(method, base, params=params, content=body)
            # The gateway's own bound on ?path= (1,024 characters) answers first, a 422.
            assert answer.status_code in (400, 422), (what, answer.status_code, answer.text[:300])
            assert time.monotonic() - started < 10, what
            assert "limit" in answer.text or "at most" in answer.text, answer.text[:300]
            _no_engine_detail(answer.text)


def _no_engine_detail(text: str) -> None:
    for leak in ("docker", "Docker", "unix://", "http+docker", "/var/lib", "containerd", "overlay"):
        assert leak not in text, (leak, text[:500])


# -- under gVisor


def _runsc_registered() -> bool:
    try:
        client = docker.from_env(timeout=30)
        try:
            return "runsc" in (client.info().get("Runtimes") or {})
        finally:
            client.close()
    except docker.errors.DockerException:
        return False


@pytest.fixture(scope="module")
def gvisor_tenant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenant]:
    if not _runsc_registered():
        pytest.skip("runsc is not registered with the Docker engine (make setup registers it)")
    config = StackConfig.isolated(
        Path(tmp_path_factory.mktemp("gvisor")),
        llm_script=SCRIPT,
        extra_env={"DECKHANDS_POOL_MIN_IDLE": "1", "DECKHANDS_DOCKER_RUNTIME": "runsc"},
    )
    with running(config) as stack:
        key = issue_key(stack.config.gateway_url, stack.admin_api_key, "gv", name="gvisor")
        with httpx.Client(
            base_url=stack.config.gateway_url, headers=auth_headers(key), timeout=60
        ) as http:
            yield Tenant("gv", key, http)


def test_under_gvisor_every_helper_runs_under_gvisor(gvisor_tenant: Tenant, tmp_path: Path) -> None:
    tenant = gvisor_tenant
    task_id = tenant.create(task="ask: a task under gVisor whose workspace is attacked")
    tenant.wait(task_id, "AWAITING_USER_INPUT", timeout_s=120)
    base = f"/v1/tasks/{task_id}/workspace"
    with HelperRuntimes() as helpers:
        up = tenant.http.put(base, content=_evil_repository(tmp_path / "repo"))
        assert up.status_code == 200, up.text
        for _ in range(2):
            diff = tenant.http.get(f"{base}/diff")
    assert diff.status_code == 200, diff.text
    _assert_clean_diff(diff, shows="+after")
    assert len(helpers.seen) >= 3 and set(helpers.seen) == {"runsc"}, helpers.seen
