"""Issue 27, item 3: a tenant's secret bound to a host reaches that host as a header, added by
the egress proxy, and the sandbox never holds it.

On real NATS, Redis, Docker and two egress proxy processes with the deployment's CA. The hosts
are HTTPS test servers on 127.0.0.2 with certificates of a test CA that the proxy trusts
upstream and the sandbox does not: a host the proxy tunnels untouched fails the sandbox's own
verification, which shows that only the bound host's TLS is ended by the proxy."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from egress_proxies import Proxies, sh, two_proxies  # type: ignore[import-not-found]
from nats.js import JetStreamContext
from pydantic import SecretStr
from redis.asyncio import Redis
from runtime_helpers import Controller, make_settings  # type: ignore[import-not-found]
from tls_site import TlsSite, tls_serving  # type: ignore[import-not-found]

from services.runtime.settings import RuntimeSettings
from shared.egress_policy import EgressPolicy
from shared.secret_egress import SecretEgress
from shared.secrets_store import SecretsCipher, SecretsStore, new_secrets_key
from shared.settings import CommonSettings
from tools.egress_ca import ensure_egress_ca, new_ca

pytestmark = pytest.mark.docker

TENANT = "team-secrets"
TOKEN = "ghp-" + uuid.uuid4().hex  # the bound secret's value
PLAIN = "plain-" + uuid.uuid4().hex  # a secret for the environment, as before

# Fetches a URL through the proxy (the environment's), with the system's trust (the egress CA
# added by the holder): the status and body, or the error's kind.
FETCH = r"""
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
        print("STATUS", r.status, r.read(300).decode(errors="replace").strip())
except urllib.error.HTTPError as e:
    print("STATUS", e.code, e.read(300).decode(errors="replace").strip())
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""


@pytest.fixture(scope="module")
def secrets_key() -> str:
    return new_secrets_key()


@pytest.fixture(scope="module")
def upstream_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path]:
    """The test servers' CA: (key + certificate, the certificate's file for the proxy)."""
    both, cert = new_ca("test upstream CA")
    path = Path(tmp_path_factory.mktemp("upstream-ca")) / "ca.crt"
    path.write_bytes(cert)
    return both, path


@pytest.fixture(scope="module")
def other_host(
    upstream_ca: tuple[bytes, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsSite]:
    with tls_serving(upstream_ca[0], Path(tmp_path_factory.mktemp("other"))) as site:
        yield site


@pytest.fixture(scope="module")
def plain_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSite]:
    """A plain-HTTP host: what a redirect leads to, its requests recorded."""
    with tls_serving(None, Path(tmp_path_factory.mktemp("plain"))) as site:
        yield site


@pytest.fixture(scope="module")
def api_host(
    upstream_ca: tuple[bytes, Path],
    tmp_path_factory: pytest.TempPathFactory,
    plain_host: TlsSite,
) -> Iterator[TlsSite]:
    """The host the secret is bound to; its /redirect leads to `plain_host`."""
    workdir = Path(tmp_path_factory.mktemp("api"))
    with tls_serving(upstream_ca[0], workdir, f"http://{plain_host.address}/echo") as site:
        yield site


@pytest.fixture(scope="module")
def egress_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("egress"))


@pytest.fixture(scope="module")
def egress_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return ensure_egress_ca(Path(tmp_path_factory.mktemp("egress-ca")))


@pytest.fixture(scope="module")
def proxies(
    egress_folder: Path,
    egress_ca: tuple[Path, Path],
    upstream_ca: tuple[bytes, Path],
    secrets_key: str,
    tmp_path_factory: pytest.TempPathFactory,
    isolated_settings: CommonSettings,
) -> Iterator[Proxies]:
    env = {
        "DECKHANDS_REDIS_URL": isolated_settings.redis_url,
        "DECKHANDS_SECRETS_KEY": secrets_key,
        "DECKHANDS_EGRESS_CA_FILE": str(egress_ca[0]),
        "DECKHANDS_EGRESS_UPSTREAM_CA_FILE": str(upstream_ca[1]),
        "DECKHANDS_EGRESS_SECRETS_CACHE_S": "0",
    }
    logs = Path(tmp_path_factory.mktemp("egress-logs"))
    with two_proxies(egress_folder, logs, isolated_settings.nats_url, env) as running:
        yield running


@pytest.fixture(scope="module")
def svc_settings(
    isolated_settings: CommonSettings,
    sandbox_image: str,
    module_pool: str,
    egress_folder: Path,
    egress_ca: tuple[Path, Path],
    secrets_key: str,
    proxies: Proxies,
) -> RuntimeSettings:
    return make_settings(
        isolated_settings,
        sandbox_image,
        module_pool,
        egress_dir=str(egress_folder),
        egress_ca_cert=str(egress_ca[1]),
        secrets_key=SecretStr(secrets_key),
    )


@pytest.fixture(scope="module")
async def store(isolated_settings: CommonSettings, secrets_key: str) -> AsyncIterator[SecretsStore]:
    redis = Redis.from_url(isolated_settings.redis_url)
    yield SecretsStore(redis, SecretsCipher.from_text(secrets_key))
    await redis.aclose()


async def _task(
    runtime: object, js: JetStreamContext, store: SecretsStore, allow: list[str]
) -> Controller:
    task_id = uuid.uuid4().hex
    await store.grant(task_id, TENANT, ["GITHUB_TOKEN", "PLAIN"])
    redis_url = runtime.settings.redis_url  # type: ignore[attr-defined]
    policy = EgressPolicy(allow=tuple(allow))
    return await Controller.for_task(js, task_id, redis_url, network=policy)


def _fetch(url: str) -> str:
    return f"python3 -c '{FETCH}' {url}"


async def test_a_bound_secret_reaches_its_host_and_never_the_sandbox(
    runtime: object,
    js: JetStreamContext,
    store: SecretsStore,
    api_host: TlsSite,
    other_host: TlsSite,
    plain_host: TlsSite,
) -> None:
    bound = SecretEgress(hosts=(api_host.address,), header="Authorization", format="Bearer {}")
    await store.put(TENANT, "GITHUB_TOKEN", TOKEN, bound)
    await store.put(TENANT, "PLAIN", PLAIN)
    allow = [api_host.address, other_host.address, plain_host.address]
    ctl = await _task(runtime, js, store, allow)
    try:
        # The bound host: the proxy ends TLS with the CA the sandbox trusts and adds the
        # header; the host echoes it, and the proxy redacts it on the way back.
        echoed = await sh(ctl, _fetch(f"https://{api_host.address}/echo"))
        assert "STATUS 200 seen: Bearer <secret:GITHUB_TOKEN>" in echoed, echoed
        assert api_host.headers_seen("authorization")[-1] == f"Bearer {TOKEN}"

        # Another host in the policy: tunnelled untouched (the sandbox meets that host's own
        # certificate, which it does not trust), and nothing is added.
        untouched = await sh(ctl, _fetch(f"https://{other_host.address}/echo"))
        assert "CERTIFICATE_VERIFY_FAILED" in untouched, untouched
        assert other_host.headers_seen("authorization") == []

        # A redirect from the bound host to another: followed, without the secret.
        redirected = await sh(ctl, _fetch(f"https://{api_host.address}/redirect"))
        assert "STATUS 200 seen: -" in redirected, redirected
        assert api_host.requests[-1][0] == "/redirect"
        assert [path for path, _ in plain_host.requests] == ["/echo"]
        assert plain_host.headers_seen("authorization") == []

        # Nowhere in the sandbox: its processes' environments, its files, its folder (the
        # value is put together in the shell, so the command's own file does not hold it).
        # The environment secret is there, as before.
        half = len(TOKEN) // 2
        found = await sh(
            ctl,
            f"T={TOKEN[:half]}; T=${{T}}{TOKEN[half:]}; "
            'grep -rlF "$T" /proc/[0-9]*/environ /workspace /run /tmp /etc 2>/dev/null | wc -l; '
            f"grep -lF {PLAIN} /proc/self/environ | wc -l; echo $GITHUB_TOKEN.",
        )
        assert found.split()[:3] == ["0", "1", "."], found
    finally:
        await ctl.release()


async def test_a_request_for_another_host_inside_the_tunnel_gets_nothing(
    runtime: object,
    js: JetStreamContext,
    store: SecretsStore,
    api_host: TlsSite,
    other_host: TlsSite,
) -> None:
    """A Host header naming another host than the tunnel's: no secret is added."""
    bound = SecretEgress(hosts=(api_host.address,), header="X-Api-Key")
    await store.put(TENANT, "GITHUB_TOKEN", TOKEN, bound)
    ctl = await _task(runtime, js, store, [api_host.address, other_host.address])
    try:
        before = len(api_host.requests)
        script = (
            "import urllib.request as u; "
            f"r = u.Request('https://{api_host.address}/echo', "
            f"headers={{'Host': '{other_host.address}'}}); "
            "print(u.urlopen(r, timeout=10).status)"
        )
        await sh(ctl, f'python3 -c "{script}" 2>&1 | tail -1')
        seen = [h for _, h in api_host.requests[before:]]
        assert all("x-api-key" not in h for h in seen), seen
    finally:
        await ctl.release()
