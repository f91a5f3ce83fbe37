"""The runtime's repository fetch (services/runtime/checkout.py) against servers on loopback: a
branch, tag or commit resolved, the size bound, the token sent as an HTTP header and never
shown, schemes refused. No Docker: the checkout of the tree is the e2e test's."""

from __future__ import annotations

import base64
import http.server
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.checkout import START_REF, CheckoutFailed, fetch
from shared.workspace import RepositorySpec
from tools.stack import free_port

pytestmark = pytest.mark.timeout(120)

SCHEMES = ["https", "http", "git"]


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
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """`git daemon` on loopback serving `repo` (main, a tag, a branch) and `big` (1 MiB of
    random bytes); (the base URL, commit ids by name)."""
    root = tmp_path_factory.mktemp("served")
    repo = root / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("one\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    _git(repo, "tag", "v1")
    first = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-qb", "topic")
    (repo / "b.txt").write_text("two\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "two")
    topic = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    big = root / "big"
    big.mkdir()
    (big / "noise.bin").write_bytes(os.urandom(1 << 20))
    _git(big, "init", "-q", "-b", "main")
    _git(big, "add", "-A")
    _git(big, "commit", "-qm", "noise")
    port = free_port()
    server = subprocess.Popen(
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
    url = f"git://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["git", "ls-remote", f"{url}/repo"], capture_output=True).returncode:
            assert time.monotonic() < deadline, "git daemon did not start"
            time.sleep(0.2)
        yield url, {"main": first, "v1": first, "topic": topic}
    finally:
        server.terminate()
        server.wait(10)


async def _fetch(spec: RepositorySpec, tmp: Path, token: str | None = None, **kw: object):  # type: ignore[no-untyped-def]
    options: dict[str, object] = {"schemes": SCHEMES, "timeout_s": 60.0, "max_bytes": 64 << 20}
    options.update(kw)
    os.makedirs(tmp, exist_ok=True)
    return await fetch(spec, token, tmp, **options)  # type: ignore[arg-type]


def _head(git_dir: Path) -> str:
    return (git_dir / "HEAD").read_text().strip()


async def test_the_default_branch_a_branch_a_tag_and_a_commit(
    daemon: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, commits = daemon
    fetched = await _fetch(RepositorySpec(url=f"{url}/repo"), tmp_path / "1")
    assert fetched.commit == commits["main"] and fetched.branch == "main"
    assert _head(fetched.git_dir) == "ref: refs/heads/main"
    assert not (tmp_path / "1" / "repo" / "a.txt").exists()  # no tree on the runtime's host
    assert not list(fetched.git_dir.glob("hooks/*"))  # an empty template: no hook at all
    start = _git(fetched.git_dir.parent, "rev-parse", START_REF)
    assert start == commits["main"]

    branch = await _fetch(RepositorySpec(url=f"{url}/repo", ref="topic"), tmp_path / "2")
    assert branch.commit == commits["topic"] and branch.branch == "topic"
    assert _head(branch.git_dir) == "ref: refs/heads/topic"
    upstream = _git(branch.git_dir.parent, "rev-parse", "--abbrev-ref", "topic@{upstream}")
    assert upstream == "origin/topic"

    tag = await _fetch(RepositorySpec(url=f"{url}/repo", ref="v1"), tmp_path / "3")
    assert tag.commit == commits["v1"] and tag.branch is None
    assert _head(tag.git_dir) == commits["v1"]  # detached

    by_id = await _fetch(
        RepositorySpec(url=f"{url}/repo", ref=commits["topic"][:10]), tmp_path / "4"
    )
    assert by_id.commit == commits["topic"] and by_id.branch is None


async def test_what_cannot_be_fetched_is_named(
    daemon: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, _ = daemon
    with pytest.raises(CheckoutFailed, match="no branch, tag or commit 'nope'"):
        await _fetch(RepositorySpec(url=f"{url}/repo", ref="nope"), tmp_path / "1")
    with pytest.raises(CheckoutFailed, match="could not clone"):
        await _fetch(RepositorySpec(url=f"{url}/missing"), tmp_path / "2")
    with pytest.raises(CheckoutFailed, match="larger than"):
        await _fetch(RepositorySpec(url=f"{url}/big"), tmp_path / "3", max_bytes=256 << 10)
    with pytest.raises(CheckoutFailed, match="scheme"):
        await _fetch(RepositorySpec(url=f"file://{tmp_path}"), tmp_path / "4")
    with pytest.raises(CheckoutFailed, match="scheme"):
        await _fetch(RepositorySpec(url=f"{url}/repo"), tmp_path / "5", schemes=["https"])


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization", ""))
        self.send_response(403)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorder.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


async def test_a_token_goes_as_an_authorization_header_and_never_into_errors(
    recorder: str, tmp_path: Path
) -> None:
    token = "tok-" + "s3cr3t" * 4
    with pytest.raises(CheckoutFailed) as failure:
        await _fetch(RepositorySpec(url=f"{recorder}/private.git"), tmp_path / "1", token=token)
    expected = "Basic " + base64.b64encode(f"x-access-token:{token}".encode()).decode()
    assert _Recorder.seen and _Recorder.seen[0] == expected
    assert token not in str(failure.value)
    assert (
        not (tmp_path / "1" / "repo" / ".git" / "config").exists()
        or token not in (tmp_path / "1" / "repo" / ".git" / "config").read_text()
    )
