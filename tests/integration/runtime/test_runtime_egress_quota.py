"""Issue 27, item 5: a tenant's egress bytes per day are counted by the proxies and held to the
allowance the gateway publishes: past it a connection in progress is cut and a new one is
refused with a 429 that says so, while another tenant goes on; and one sandbox's flood of
connections does not stop another task's.

On real NATS, Redis, Docker and two egress proxy processes; the hosts are test servers on
127.0.0.2 (see test_runtime_egress.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from egress_proxies import Proxies, sh, two_proxies  # type: ignore[import-not-found]
from http_site import serving  # type: ignore[import-not-found]
from nats.js import JetStreamContext
from redis.asyncio import Redis
from runtime_helpers import Controller, make_settings  # type: ignore[import-not-found]

from services.runtime.settings import RuntimeSettings
from shared.egress_policy import EgressPolicy
from shared.egress_usage import ALLOWANCES_KEY, egress_bytes_key, utc_day
from shared.settings import CommonSettings

pytestmark = pytest.mark.docker

MIB = 1024 * 1024

FETCH = r"""
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=20) as r:
        print("STATUS", r.status, len(r.read()))
except urllib.error.HTTPError as e:
    print("STATUS", e.code, e.read(400).decode(errors="replace").strip())
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = Path(tmp_path_factory.mktemp("site"))
    (root / "small.bin").write_bytes(b"s" * 1000)
    (root / "big.bin").write_bytes(b"b" * (4 * MIB))
    with serving(root) as address:
        yield address


@pytest.fixture(scope="module")
def egress_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("egress"))


@pytest.fixture(scope="module")
def proxies(
    egress_folder: Path, tmp_path_factory: pytest.TempPathFactory, isolated_settings: CommonSettings
) -> Iterator[Proxies]:
    env = {
        "DECKHANDS_REDIS_URL": isolated_settings.redis_url,
        # A small cap per task, for the flood: past it, a 429 for that task only.
        "DECKHANDS_EGRESS_MAX_CONNECTIONS_PER_TASK": "8",
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
    proxies: Proxies,
) -> RuntimeSettings:
    return make_settings(
        isolated_settings, sandbox_image, module_pool, egress_dir=str(egress_folder)
    )


async def _task(runtime: object, js: JetStreamContext, site: str, tenant: str) -> Controller:
    redis_url = runtime.settings.redis_url  # type: ignore[attr-defined]
    policy = EgressPolicy(allow=(site,))
    return await Controller.for_task(
        js, uuid.uuid4().hex, redis_url, network=policy, tenant_id=tenant
    )


def _fetch(url: str) -> str:
    return f"python3 -c '{FETCH}' {url}"


async def _counted(redis: Redis, tenant: str, at_least: int) -> int:
    """The tenant's bytes today as the proxies counted them, once they reach `at_least`."""
    key = egress_bytes_key(tenant, utc_day(datetime.now(UTC)))
    for _ in range(100):
        counted = int(await redis.get(key) or 0)
        if counted >= at_least:
            return counted
        await asyncio.sleep(0.1)
    return int(await redis.get(key) or 0)


async def test_past_its_allowance_a_tenant_s_connections_are_cut_and_refused(
    runtime: object, js: JetStreamContext, site: str, isolated_settings: CommonSettings
) -> None:
    capped, other = f"capped-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    redis = Redis.from_url(isolated_settings.redis_url)
    await redis.hset(ALLOWANCES_KEY, capped, str(1 * MIB))  # as the gateway publishes it
    first, second = await _task(runtime, js, site, capped), await _task(runtime, js, site, other)
    try:
        # Under the allowance: as usual, and counted.
        small = await sh(first, _fetch(f"http://{site}/small.bin"))
        assert "STATUS 200 1000" in small, small
        assert await _counted(redis, capped, 1000) >= 1000
        await asyncio.sleep(1.5)  # the proxies read the allowance back with their next count
        # A download past it: cut mid-way (the client sees the connection end early).
        big = await sh(first, _fetch(f"http://{site}/big.bin"))
        assert "STATUS 200 4194304" not in big, big
        assert await _counted(redis, capped, MIB) >= MIB
        await asyncio.sleep(1.5)
        # The next connection: refused, saying why.
        refused = await sh(first, _fetch(f"http://{site}/small.bin"))
        assert "STATUS 429" in refused and "allowance for today" in refused, refused
        # Another tenant goes on.
        fine = await sh(second, _fetch(f"http://{site}/big.bin"))
        assert "STATUS 200 4194304" in fine, fine
        # The cut and the refusal are in the task's log.
        for _ in range(30):
            reasons = {c.reason for e in first.egress for c in e.connections}
            if "allowance_used" in reasons:
                break
            await first.nothing_within(0.2)
        assert "allowance_used" in reasons, reasons
    finally:
        await redis.hdel(ALLOWANCES_KEY, capped)
        await redis.aclose()
        await first.release()
        await second.release()


async def test_one_sandbox_s_flood_does_not_stop_another_task_s_egress(
    runtime: object, js: JetStreamContext, site: str
) -> None:
    """The flooder holds many connections at once: past its cap (8 per replica here) it gets
    429s, its own; the quiet task's requests meanwhile all succeed."""
    flooder = await _task(runtime, js, site, "flooder")
    quiet = await _task(runtime, js, site, "quiet")
    flood = (
        "python3 -c '"
        "import urllib.request as u, concurrent.futures as f\n"
        "def get(_):\n"
        "    try:\n"
        f'        return u.urlopen("http://{site}/big.bin", timeout=60).status\n'
        "    except Exception as e:\n"
        '        return getattr(e, "code", 0)\n'
        "codes = list(f.ThreadPoolExecutor(40).map(get, range(120)))\n"
        'print("FLOOD", codes.count(200), codes.count(429))\''
    )
    try:
        flooding = asyncio.create_task(sh(flooder, flood))
        await asyncio.sleep(1.0)
        answers = [await sh(quiet, _fetch(f"http://{site}/small.bin")) for _ in range(5)]
        for answer in answers:
            assert "STATUS 200 1000" in answer, answers
        out = (await flooding).split()
        assert out[0] == "FLOOD" and int(out[2]) > 0, out  # it met its own cap
        assert int(out[1]) > 0, out
    finally:
        await flooder.release()
        await quiet.release()
