"""The runtime's repository fetch (services/runtime/checkout.py) against servers on loopback: a
branch, tag or commit resolved, the size bound, the token sent as an HTTP header and never
shown, schemes refused; the address policy (a name resolved once, checked, and git pinned to
the checked address; no redirect followed) and reasons that never quote the remote. No Docker:
the checkout of the tree is the e2e test's."""

from __future__ import annotations

import base64
import http.server
import ipaddress
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from net_listener import Listener  # type: ignore[import-not-found]

from services.runtime import checkout
from services.runtime.checkout import NAME_REFUSED, REFUSED, START_REF, fetch
from services.runtime.errors import CheckoutFailed
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
    options: dict[str, object] = {
        "schemes": SCHEMES,
        "timeout_s": 60.0,
        "max_bytes": 64 << 20,
        "allowed_hosts": ["127.0.0.1"],  # the servers here are on loopback
    }
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
    with pytest.raises(CheckoutFailed, match="could not be fetched: not a git repository"):
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


# --- the address policy (issue 24) -------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


def _resolving_to(*addresses: str) -> Any:
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return list(addresses)

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "localhost", "[::1]", "2130706433", "0x7f000001", "0177.0.0.1", "127.1"],
)
async def test_a_loopback_repository_is_refused_before_any_connection(
    host: str, listener: Listener, tmp_path: Path
) -> None:
    spec = RepositorySpec(url=f"http://{host}:{listener.port}/x.git")
    with pytest.raises(CheckoutFailed) as failure:
        await _fetch(spec, tmp_path, allowed_hosts=[])
    assert str(failure.value) == REFUSED
    assert listener.connections == 0


@pytest.mark.parametrize("scheme", ["http", "git"])
async def test_a_name_resolving_to_loopback_is_refused_and_looked_up_once(
    scheme: str, listener: Listener, tmp_path: Path
) -> None:
    resolve = _resolving_to("127.0.0.1")
    spec = RepositorySpec(url=f"{scheme}://repo.example.test:{listener.port}/x.git")
    with pytest.raises(CheckoutFailed) as failure:
        await _fetch(spec, tmp_path, allowed_hosts=[], resolve=resolve)
    assert str(failure.value) == NAME_REFUSED
    assert resolve.asked == ["repo.example.test"]
    assert listener.connections == 0


async def test_a_name_that_does_not_resolve_says_the_same_as_a_refused_one(
    tmp_path: Path,
) -> None:
    async def unknown(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    spec = RepositorySpec(url="https://git.internal.example/x.git")
    with pytest.raises(CheckoutFailed) as failure:
        await _fetch(spec, tmp_path, allowed_hosts=[], resolve=unknown)
    assert str(failure.value) == NAME_REFUSED


async def test_the_system_lookup_of_this_hosts_name_is_checked(tmp_path: Path) -> None:
    name = socket.gethostname()
    try:
        addresses = {str(i[4][0]) for i in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    except OSError:
        pytest.skip(f"this host's name {name!r} does not resolve")
    if not any(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        pytest.skip(f"this host's name {name!r} does not resolve to loopback: {addresses}")
    with pytest.raises(CheckoutFailed) as failure:
        await _fetch(RepositorySpec(url=f"git://{name}:1/x"), tmp_path, allowed_hosts=[])
    assert str(failure.value) == NAME_REFUSED


@pytest.mark.parametrize("scheme", ["git", "http"])
async def test_git_goes_to_the_checked_address_not_a_second_lookup(
    scheme: str,
    daemon: tuple[str, dict[str, str]],
    recorder: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`repo.example.test` resolves nowhere for git itself: the clone reaches the server only
    through the address pinned for it (the check is let through here, the servers being on
    loopback)."""

    async def let_through(host: str, port: int, resolve: Any) -> str:
        return str((await resolve(host, port))[0])

    monkeypatch.setattr(checkout, "checked_address", let_through)
    resolve = _resolving_to("127.0.0.1")
    if scheme == "git":
        port = daemon[0].rsplit(":", 1)[1]
        url = f"git://repo.example.test:{port}/repo"
        fetched = await _fetch(RepositorySpec(url=url), tmp_path, allowed_hosts=[], resolve=resolve)
        assert fetched.commit == daemon[1]["main"]
        # The address was written in git's URL; origin names the host again.
        origin = _git(fetched.git_dir.parent, "config", "remote.origin.url")
        assert origin == url
    else:
        port = recorder.rsplit(":", 1)[1]
        url = f"http://repo.example.test:{port}/private.git"
        with pytest.raises(CheckoutFailed, match="access refused"):
            await _fetch(
                RepositorySpec(url=url), tmp_path, "tok", allowed_hosts=[], resolve=resolve
            )
        assert _Recorder.seen  # reached, through the pin
    assert resolve.asked == ["repo.example.test"]


class _Redirect(http.server.BaseHTTPRequestHandler):
    to = ""

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.to + self.path)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


async def test_a_redirect_is_not_followed(listener: Listener, tmp_path: Path) -> None:
    _Redirect.to = f"http://127.0.0.1:{listener.port}"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x.git"
        with pytest.raises(CheckoutFailed, match="could not be fetched"):
            await _fetch(RepositorySpec(url=url), tmp_path)
    finally:
        server.shutdown()
    assert listener.connections == 0


@pytest.mark.parametrize(
    ("banner", "scheme"),
    [
        (b'INFO {"server_id":"NATS","version":"2.10"}\r\n', "git"),  # NATS' banner
        (b'INFO {"server_id":"NATS","version":"2.10"}\r\n', "http"),
        (b"", "http"),  # Redis: an empty reply
        (b"-ERR wrong number of arguments\r\n", "git"),
    ],
)
async def test_a_failure_says_what_failed_not_what_the_remote_said(
    banner: bytes, scheme: str, tmp_path: Path
) -> None:
    server = Listener(banner=banner)
    try:
        url = f"{scheme}://127.0.0.1:{server.port}/x.git"
        with pytest.raises(CheckoutFailed) as failure:
            await _fetch(RepositorySpec(url=url), tmp_path)
    finally:
        server.close()
    reason = str(failure.value)
    assert reason.startswith("the repository could not be fetched: "), reason
    for word in ("INFO", "NATS", "ERR", "line length", "Empty reply", "HTTP/0.9", "fatal"):
        assert word not in reason, reason
    assert server.connections >= 1  # it was reached (the operator allows 127.0.0.1 here)


async def test_a_closed_port_is_a_failed_connection(tmp_path: Path) -> None:
    port = free_port()
    for scheme in ("git", "http"):
        with pytest.raises(CheckoutFailed) as failure:
            await _fetch(RepositorySpec(url=f"{scheme}://127.0.0.1:{port}/x"), tmp_path / scheme)
        assert str(failure.value) == "the repository could not be fetched: connection failed"


async def test_a_public_address_is_given_to_git_as_it_is() -> None:
    """No resolve entry for an address (curl has nothing to look up; an IPv6 one would not even
    parse as host:port:address); a name gets one."""
    literal = await checkout._route("https://[2606:4700::1111]/x.git", frozenset(), _resolving_to())
    assert literal.url == "https://[2606:4700::1111]/x.git"
    assert not any("curloptResolve" in c for c in literal.config)
    named = await checkout._route(
        "https://Git.Example.COM./x.git#frag", frozenset(), _resolving_to("2606:4700::1111")
    )
    assert named.url == "https://git.example.com/x.git"
    assert "http.curloptResolve=git.example.com:443:[2606:4700::1111]" in named.config
    assert "http.followRedirects=false" in named.config
    git = await checkout._route("git://git.example.com/x", frozenset(), _resolving_to("1.1.1.1"))
    assert (git.url, git.origin) == ("git://1.1.1.1/x", "git://git.example.com/x")
