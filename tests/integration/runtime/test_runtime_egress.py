"""Issue 27: a task with a network policy reaches what its policy allows through the egress
proxy, and nothing else: its sandbox has no network at all, only the proxy's folder.

On real NATS, Redis, Docker and two egress proxy processes (services/egress, mitmproxy in
.venv-egress). The hosts "outside" are test servers on 127.0.0.2, loopback of this machine that
the sandbox's NO_PROXY does not name: the proxy on the host reaches them only when the task's
policy names their address (a private address needs that), and a listener counts every
connection a refused attempt might have made."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import nats
import pytest
from egress_proxies import Proxies, sh, two_proxies  # type: ignore[import-not-found]
from egress_site import publish_site  # type: ignore[import-not-found]
from http_site import OUTSIDE, serving  # type: ignore[import-not-found]
from nats.js import JetStreamContext
from net_listener import Listener  # type: ignore[import-not-found]
from redis.asyncio import Redis
from runtime_helpers import Controller, make_settings  # type: ignore[import-not-found]

from services.runtime.egress_stores import ROLE_EGRESS_FOLDERS
from services.runtime.sandbox_labels import LABEL_POOL, LABEL_ROLE
from services.runtime.settings import RuntimeSettings
from shared.egress_policy import EgressPolicy
from shared.settings import CommonSettings
from shared.state_store import TaskStateStore

pytestmark = pytest.mark.docker


# Fetches a URL the way pip's and most tools' HTTP stacks do (the proxy from the environment),
# printing the status and the first bytes of the body, or the error.
FETCH = r"""
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
        print("STATUS", r.status, r.read(200).decode(errors="replace"))
except urllib.error.HTTPError as e:
    print("STATUS", e.code, e.read(400).decode(errors="replace"))
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""


# Many pieces of the proxy's reads, and not a multiple of any read size.
_BIG = random.Random(27).randbytes(3 * 1024 * 1024 + 17)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A file, a package index, a git repository and an npm registry, on one test server."""
    root = tmp_path_factory.mktemp("site")
    (root / "hello.txt").write_text("hello-from-the-allowed-host")
    (root / "big.bin").write_bytes(_BIG)
    with serving(root, lambda address: publish_site(root, address)) as address:
        yield address


@pytest.fixture
def elsewhere() -> Iterator[Listener]:
    listener = Listener(OUTSIDE, banner=b"INFO secret-banner\r\n")
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def egress_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("egress"))


@pytest.fixture(scope="module")
def proxies(
    egress_folder: Path, tmp_path_factory: pytest.TempPathFactory, isolated_settings: CommonSettings
) -> Iterator[Proxies]:
    logs = Path(tmp_path_factory.mktemp("egress-logs"))
    with two_proxies(egress_folder, logs, isolated_settings.nats_url) as running:
        yield running


@pytest.fixture(scope="module", params=["shared folder", "through the engine"])
def svc_settings(
    request: pytest.FixtureRequest,
    isolated_settings: CommonSettings,
    sandbox_image: str,
    module_pool: str,
    egress_folder: Path,
    proxies: Proxies,
) -> RuntimeSettings:
    """Each test twice: with the proxies' folder shared with the runtime (DECKHANDS_EGRESS_DIR),
    and kept on the engine's host through a helper container (DECKHANDS_EGRESS_ENGINE_DIR, as
    on the gVisor node pool, where the runtime may mount nothing of its node; here the engine's
    host is this one, so the proxies read it as they would on a node)."""
    where: dict[str, Any] = {"egress_dir": str(egress_folder)}
    if request.param == "through the engine":
        where = {"egress_engine_dir": str(egress_folder), "egress_folder_owner": os.getuid()}
    return make_settings(isolated_settings, sandbox_image, module_pool, **where)


async def _task(runtime: object, js: JetStreamContext, allow: list[str]) -> Controller:
    redis_url = runtime.settings.redis_url  # type: ignore[attr-defined]
    policy = EgressPolicy(allow=tuple(allow))
    return await Controller.for_task(js, uuid.uuid4().hex, redis_url, network=policy)


def _fetch(url: str, *, every_host_proxied: bool = False) -> str:
    prefix = "NO_PROXY= no_proxy= " if every_host_proxied else ""
    return f"{prefix}python3 -c '{FETCH}' {url}"


async def test_an_allowed_host_is_reached_and_nothing_else(
    runtime: object, js: JetStreamContext, site: str, elsewhere: Listener
) -> None:
    ctl = await _task(runtime, js, [site, "*"])
    try:
        allowed = await sh(ctl, _fetch(f"http://{site}/hello.txt"))
        assert "STATUS 200 hello-from-the-allowed-host" in allowed, allowed

        other_port = await sh(ctl, _fetch(f"http://{OUTSIDE}:{elsewhere.port}/"))
        assert "STATUS 403" in other_port and "network policy" in other_port, other_port
        # A name that resolves to loopback, and the cloud metadata address, though the policy
        # allows any public host (`*`): refused after resolution, and as written.
        for url in ("http://localhost:9/", "http://169.254.169.254/latest/meta-data/"):
            refused = await sh(ctl, _fetch(url, every_host_proxied=True))
            assert "STATUS 403" in refused, (url, refused)
        # Around the proxy: no route at all, and no name service.
        direct = await sh(
            ctl,
            "python3 -c 'import socket; socket.create_connection("
            f'("{OUTSIDE}", {elsewhere.port}), 3)\' 2>&1 | tail -1; '
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            '.sendto(b"x", ("8.8.8.8", 53))\' 2>&1 | tail -1; '
            "getent hosts pypi.org || echo no-name-service",
        )
        assert "Connection refused" in direct or "unreachable" in direct, direct
        # UDP out: no route at all (Linux: ENETUNREACH; gVisor: EHOSTUNREACH).
        assert "Network is unreachable" in direct or "No route to host" in direct, direct
        assert "no-name-service" in direct, direct
        assert elsewhere.connections == 0
        assert "secret-banner" not in other_port + direct
    finally:
        await ctl.release()


async def test_the_sandbox_has_no_network_but_its_read_only_folder(
    runtime: object, js: JetStreamContext, site: str, docker_client: docker.DockerClient
) -> None:
    ctl = await _task(runtime, js, [site])
    try:
        seen = await sh(
            ctl,
            "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ,; echo; "
            "ls /run/deckhands/egress | sort | tr '\\n' ,; echo; "
            "touch /run/deckhands/egress/x 2>&1 | grep -o -E 'Read-only file system|Permission "
            "denied'; "
            "echo $HTTPS_PROXY",
        )
        interfaces, files, read_only, proxy = seen.strip().splitlines()[:4]
        assert interfaces == "lo,", seen
        assert files == (
            "egress-0.handoff,egress-0.sock,egress-1.handoff,egress-1.sock,policy.json,"
        ), seen
        # Not written (Linux answers a read-only mount with EROFS, gVisor with EACCES).
        assert read_only in ("Read-only file system", "Permission denied"), seen
        assert proxy == "http://127.0.0.1:3128", seen
    finally:
        await ctl.release()


async def test_a_killed_proxy_replica_leaves_the_other_to_carry_on(
    runtime: object, js: JetStreamContext, site: str, proxies: Proxies
) -> None:
    ctl = await _task(runtime, js, [site])
    try:
        before = await sh(ctl, _fetch(f"http://{site}/hello.txt"))
        assert "STATUS 200" in before, before
        proxies.kill("egress-0")
        for _ in range(3):  # each a new connection: whichever socket the relay tries first
            after = await sh(ctl, _fetch(f"http://{site}/hello.txt"))
            assert "STATUS 200 hello-from-the-allowed-host" in after, after
    finally:
        proxies.start("egress-0")
        await ctl.release()


async def test_pip_git_and_npm_work_through_the_proxy(
    runtime: object, js: JetStreamContext, site: str
) -> None:
    """The tools a task needs, as they are, with nothing but the environment's proxy."""
    ctl = await _task(runtime, js, [site])
    try:
        pip = await sh(
            ctl,
            f"pip install -q --index-url http://{site}/simple/ tinypkg 2>&1 | tail -3; "
            "python3 -c 'import tinypkg; print(tinypkg.VALUE)'",
        )
        assert "installed-through-the-proxy" in pip, pip
        git = await sh(
            ctl,
            f"git clone -q http://{site}/repo.git /workspace/repo 2>&1; cat /workspace/repo/README",
        )
        assert "cloned-through-the-proxy" in git, git
        npm = await sh(
            ctl,
            f"cd /workspace && npm install --no-audit --no-fund --registry http://{site}/ "
            "tinynpm 2>&1 | tail -3; node -e 'console.log(require(\"tinynpm\"))'",
        )
        assert "npm-through-the-proxy" in npm, npm
    finally:
        await ctl.release()


async def test_each_connection_reaches_the_tasks_log(
    runtime: object, js: JetStreamContext, site: str, elsewhere: Listener
) -> None:
    """The proxy's account of what the sandbox reached and was refused goes to the controller,
    which logs it (services/egress/activity.py)."""
    ctl = await _task(runtime, js, [site])
    try:
        await sh(ctl, _fetch(f"http://{site}/hello.txt"))
        await sh(ctl, _fetch(f"http://{OUTSIDE}:{elsewhere.port}/"))
        deadline = time.monotonic() + 10
        seen: list[Any] = []
        while time.monotonic() < deadline:
            seen = [c for entry in ctl.egress for c in entry.connections]
            if len(seen) >= 2:
                break
            with contextlib.suppress(nats.errors.TimeoutError):
                await ctl.receive(timeout=0.5)
        reached = [c for c in seen if c.allowed]
        refused = [c for c in seen if not c.allowed]
        assert [(c.host, c.port) for c in reached] == [tuple(_split(site))], seen
        assert reached[0].bytes_in > len("hello-from-the-allowed-host"), reached
        assert [(c.host, c.port, c.reason) for c in refused] == [
            (OUTSIDE, elsewhere.port, "not_allowed")
        ], seen
        assert all(e.task_id == ctl.task_id for e in ctl.egress)
    finally:
        await ctl.release()


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


async def test_a_widened_policy_is_in_force_from_the_next_action(
    runtime: object, js: JetStreamContext, site: str, elsewhere: Listener
) -> None:
    """A user's message widened the task's policy (the controller's State and its orders carry
    it): the runtime writes it to the sandbox's folder, and the proxy follows it at once."""
    ctl = await _task(runtime, js, [site])
    other = f"{OUTSIDE}:{elsewhere.port}"
    try:
        before = await sh(ctl, _fetch(f"http://{other}/"))
        assert "STATUS 403" in before, before
        wider = EgressPolicy(allow=(site, other))
        redis = Redis.from_url(runtime.settings.redis_url)  # type: ignore[attr-defined]
        try:
            store = TaskStateStore(redis)
            state = await store.load(ctl.task_id)
            assert state is not None
            await store.save(state.model_copy(update={"network": wider}))
        finally:
            await redis.aclose()
        ctl.network = wider
        after = await sh(ctl, _fetch(f"http://{other}/"))
        # The listener answers a banner, not HTTP: what matters is that it was reached.
        assert "STATUS 403" not in after, after
        assert elsewhere.connections == 1
    finally:
        await ctl.release()


@pytest.fixture(scope="module")
def other_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("other-site")
    (root / "hello.txt").write_text("hello-from-the-other-host")
    with serving(root) as address:
        yield address


BACKGROUND = r"""
import time, urllib.request, urllib.error
for i in range(60):
    try:
        print("OK", urllib.request.urlopen(URL, timeout=2).status, flush=True)
    except urllib.error.HTTPError as e:
        print("REFUSED", e.code, flush=True)
    except Exception as e:
        print("FAILED", type(e).__name__, flush=True)
    time.sleep(0.2)
"""


async def test_an_action_reaches_its_scope_and_nothing_runs_between_actions(
    runtime: object, js: JetStreamContext, site: str, other_site: str
) -> None:
    """Issue 27, item 6: an action whose verdict scoped it to one host of the policy reaches
    that host only; a process left running in the background reaches nothing once its action
    ended, nor during an action scoped to nothing."""
    ctl = await _task(runtime, js, [site, other_site])
    try:
        ctl.scope = EgressPolicy(allow=(site,))
        scoped = await sh(
            ctl,
            _fetch(f"http://{site}/hello.txt") + "; " + _fetch(f"http://{other_site}/hello.txt"),
        )
        assert "STATUS 200 hello-from-the-allowed-host" in scoped, scoped
        assert "STATUS 403" in scoped and "hello-from-the-other-host" not in scoped, scoped
        ctl.scope = None  # the whole policy: the background loop starts and reaches it
        script = BACKGROUND.replace("URL", repr(f"http://{other_site}/hello.txt"))
        started = await sh(
            ctl,
            f"cat > /tmp/bg.py <<'EOF'\n{script}\nEOF\n"
            "nohup python3 /tmp/bg.py > /tmp/bg.log 2>&1 & sleep 1.5; cat /tmp/bg.log",
        )
        assert "OK 200" in started, started
        ctl.scope = EgressPolicy()  # an action that connects nowhere (`sleep`, `cat`)
        later = await sh(ctl, "sleep 3; tail -n 5 /tmp/bg.log")
        lines = later.strip().splitlines()[-5:]
        assert lines and all(not line.startswith("OK") for line in lines), later
        assert any(line.startswith("REFUSED 403") for line in lines), later
    finally:
        await ctl.release()


BACKGROUND_TWO = r"""
import time, urllib.request, urllib.error
for i in range(60):
    for name, url in (("KEPT", KEPT_URL), ("OTHER", OTHER_URL)):
        asked = time.time()
        try:
            said = "OK %d" % urllib.request.urlopen(url, timeout=2).status
        except urllib.error.HTTPError as e:
            said = "REFUSED %d" % e.code
        except Exception as e:
            said = "FAILED " + type(e).__name__
        print(name, said, "%.3f" % asked, "%.3f" % time.time(), flush=True)
    time.sleep(0.2)
"""


async def test_between_actions_a_background_process_reaches_what_the_task_keeps(
    runtime: object, js: JetStreamContext, site: str, other_site: str
) -> None:
    """A task whose policy keeps `other_site` between actions (`between_actions`): once the
    action that started it ended, a background process still reaches that host, and only it."""
    redis_url = runtime.settings.redis_url  # type: ignore[attr-defined]
    policy = EgressPolicy(allow=(site, other_site), between_actions=(other_site,))
    ctl = await Controller.for_task(js, uuid.uuid4().hex, redis_url, network=policy)
    try:
        script = BACKGROUND_TWO.replace("KEPT_URL", repr(f"http://{other_site}/hello.txt")).replace(
            "OTHER_URL", repr(f"http://{site}/hello.txt")
        )
        started = await sh(
            ctl,
            f"cat > /tmp/bg.py <<'EOF'\n{script}\nEOF\n"
            "nohup python3 /tmp/bg.py > /tmp/bg.log 2>&1 & sleep 1.5; cat /tmp/bg.log",
        )
        assert "KEPT OK 200" in started and "OTHER OK 200" in started, started
        await asyncio.sleep(3)  # no action runs: the task's between_actions holds
        # Read by an action, whose own scope holds both hosts while it runs: only what the
        # background process asked and heard before it (the sandbox's clock is the host's).
        before = time.time() - 0.2
        later = await sh(ctl, "tail -n 12 /tmp/bg.log")
        lines = [
            " ".join(x.split()[:3])
            for x in later.strip().splitlines()
            if len(x.split()) == 5 and float(x.split()[4]) < before
        ][-6:]
        assert [x for x in lines if x.startswith("KEPT")], later
        assert all(x == "KEPT OK 200" for x in lines if x.startswith("KEPT")), later
        assert all(x.startswith("OTHER REFUSED 403") for x in lines if x.startswith("OTHER")), later
    finally:
        await ctl.release()


def _pass(path: Path, fds: list[int]) -> tuple[socket.socket, bytes]:
    """Connect to a replica's handoff socket, pass `fds` with one byte, read its answer."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(5)
    conn.connect(str(path))
    socket.send_fds(conn, [b"H"], fds) if fds else conn.sendall(b"H")
    return conn, conn.recv(1)


_REQUEST = "GET http://{0}/hello.txt HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n"


def _get(stream: socket.socket, site: str) -> bytes:
    stream.settimeout(10)
    stream.sendall(_REQUEST.format(site).encode())
    answer = b""
    while chunk := stream.recv(65536):
        answer += chunk
    return answer


# Between actions the sandbox's policy is empty (its scope: nothing runs), so what the replica
# answers the test's requests, as this sandbox's, is its refusal.
_SERVED = b"is not in this task's network policy (it allows: nothing)"


def _try_handoffs(folder: Path, site: str, pid: int) -> None:
    handoff = folder / "egress-0.handoff"
    deadline = time.monotonic() + 10
    while not handoff.exists():
        assert time.monotonic() < deadline, "no handoff socket"
        time.sleep(0.1)
    held_before = len(os.listdir(f"/proc/{pid}/fd"))

    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname()[:2])
        accepted, _ = listener.accept()
    conn, answer = _pass(handoff, [accepted.fileno()])
    accepted.close()
    conn.close()
    assert answer == b"1"
    assert _SERVED in _get(client, site)
    client.close()

    left, right = socket.socketpair()
    with open(__file__, "rb") as file:
        for fds in ([file.fileno()], [left.fileno()], [left.fileno()] * 3, []):
            conn, answer = _pass(handoff, fds)
            assert answer == b"0", fds
            assert _SERVED in _get(conn, site), fds
            conn.close()
    left.close()
    right.close()

    deadline = time.monotonic() + 10
    while len(os.listdir(f"/proc/{pid}/fd")) > held_before:
        assert time.monotonic() < deadline, "the replica kept descriptors"
        time.sleep(0.2)


async def test_a_passed_connection_is_served_and_nothing_else_is_taken(
    runtime: object, js: JetStreamContext, site: str, proxies: Proxies, egress_folder: Path
) -> None:
    """The sandbox's relay passes each client's TCP socket to a replica, which serves it
    itself (services/egress/passed_sockets.py). What else a sandbox may pass (a file, a unix
    socket, several descriptors, none) is not taken: answered 0, closed, and the unix connection
    is served as a plain stream instead; the replica keeps none of those descriptors."""
    ctl = await _task(runtime, js, [site])
    try:
        await sh(ctl, "true")  # its sandbox bound, its folder made
        policies = await asyncio.to_thread(lambda: list(egress_folder.glob("*/policy.json")))
        folder = next(p.parent for p in policies if ctl.task_id in p.read_text())
        await asyncio.to_thread(_try_handoffs, folder, site, proxies.procs["egress-0"].pid)
        assert "STATUS 200" in await sh(ctl, _fetch(f"http://{site}/hello.txt"))
    finally:
        await ctl.release()


def _past_layers(proxies: Proxies) -> float:
    """Bytes of bodies written past mitmproxy's layers: from Python, or by splice."""
    return proxies.counted("deckhands_egress_body_relayed_bytes_total") + proxies.counted(
        "deckhands_egress_body_spliced_bytes_total"
    )


async def test_a_large_body_arrives_whole_and_unchanged(
    runtime: object, js: JetStreamContext, site: str, proxies: Proxies
) -> None:
    """Bodies of many pieces through the proxy (passed on uncopied: pieces_reader.py,
    body_pieces.py; written past mitmproxy's layers: body_relay.py, body_splice.py) arrive byte
    for byte, one after another on a kept-alive connection, a small one between them."""
    past_layers = _past_layers(proxies)
    ctl = await _task(runtime, js, [site])
    try:
        seen = await sh(
            ctl,
            "python3 -c 'import hashlib, http.client, sys; "
            'c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=30)\n'
            'for name in ("big.bin", "hello.txt", "big.bin"):\n'
            '    c.request("GET", f"http://{sys.argv[1]}/{name}")\n'
            "    b = c.getresponse().read()\n"
            '    print("GOT", name, len(b), hashlib.sha256(b).hexdigest())\n'
            'print("ONE CONNECTION", c.sock is not None)\' '
            f"{site}",
        )
        digest = hashlib.sha256(_BIG).hexdigest()
        hello = hashlib.sha256(b"hello-from-the-allowed-host").hexdigest()
        assert seen.count(f"GOT big.bin {len(_BIG)} {digest}") == 2, seen
        assert f"GOT hello.txt 27 {hello}" in seen, seen
        assert "ONE CONNECTION True" in seen, seen
        # Most of each big body went past mitmproxy's layers (its headers, its first piece and
        # its last byte through them), from Python or inside the kernel.
        past_layers = _past_layers(proxies) - past_layers
        assert len(_BIG) < past_layers < 2 * len(_BIG), past_layers
    finally:
        await ctl.release()


def _folders(root: Path) -> dict[str, tuple[dict[str, Any], int]]:
    """Each sandbox folder's policy, and the uid that owns the folder (one removed while this
    looks, as a released sandbox's is, is left out)."""
    found = {}
    for folder in root.glob("sbx-*"):
        try:
            found[folder.name] = (
                json.loads((folder / "policy.json").read_text()),
                folder.stat().st_uid,
            )
        except FileNotFoundError:
            continue
    return found


async def test_a_sandboxs_folder_is_the_proxies_and_goes_with_it(
    runtime: object,
    js: JetStreamContext,
    site: str,
    egress_folder: Path,
    module_pool: str,
    docker_client: docker.DockerClient,
) -> None:
    settings: RuntimeSettings = runtime.settings  # type: ignore[attr-defined]
    ctl = await _task(runtime, js, [site])
    try:
        assert "STATUS 200" in await sh(ctl, _fetch(f"http://{site}/hello.txt"))
        folders = await asyncio.to_thread(_folders, egress_folder)
        token = next(t for t, (policy, _) in folders.items() if policy["task_id"] == ctl.task_id)
        policy, owner = folders[token]
        assert owner == os.getuid()  # the proxies' uid: they listen in it
        assert policy["network"]["allow"] == []  # between actions: nothing (the default)
        if settings.egress_engine_dir:
            # The helper: no network, a read-only root, nothing of the host but that folder.
            labels = [f"{LABEL_ROLE}={ROLE_EGRESS_FOLDERS}", f"{LABEL_POOL}={module_pool}"]
            helpers = docker_client.api.containers(filters={"label": labels})
            assert len(helpers) == 1
            info = docker_client.api.inspect_container(helpers[0]["Id"])
            assert info["HostConfig"]["NetworkMode"] == "none"
            assert info["HostConfig"]["ReadonlyRootfs"] is True
            assert [m["Source"] for m in info["Mounts"]] == [str(egress_folder)]
            # Gone (an operator's cleanup): the next action's policy is written by a new one.
            docker_client.api.remove_container(helpers[0]["Id"], force=True)
            assert "STATUS 200" in await sh(ctl, _fetch(f"http://{site}/hello.txt"))
            assert len(docker_client.api.containers(filters={"label": labels})) == 1
    finally:
        await ctl.release()
    for _ in range(100):  # removed with its sandbox
        if token not in await asyncio.to_thread(_folders, egress_folder):
            break
        await asyncio.sleep(0.1)
    assert token not in await asyncio.to_thread(_folders, egress_folder)
