"""Wiring of the egress proxy: mitmproxy on loopback, the sandboxes' sockets, health, Redis
(bound secrets, egress bytes per day), NATS (each task's connections to its log).

Runs in its own virtualenv (`.venv-egress`, deploy/egress/requirements.txt): mitmproxy pins
versions of its own, and it needs Python 3.12. Of shared/ it imports only what needs pydantic,
redis, nats-py and cryptography (tests/unit/test_import_rules.py imports it there).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from typing import Any

from mitmproxy import options
from mitmproxy.addons import core, disable_h2c, errorcheck, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master
from pydantic import ValidationError
from redis.asyncio import Redis

from shared import event_loop

from .activity import Activity
from .body_pieces import pass_body_pieces
from .body_relay import relay_streamed_bodies
from .handlers import EgressHandlers
from .health import serve_health
from .links import Links
from .log_sender import LogSender
from .pieces_reader import PiecesReader, use_pieces_readers
from .read_size import read_larger_pieces, write_ahead
from .secret_headers import SecretHeaders
from .settings import EgressSettings
from .sockets import SandboxSockets
from .tls_setup import prepare_confdir
from .usage import EgressUsage

__all__ = ["main", "serve"]

log = logging.getLogger("deckhands.egress")


def _options(settings: EgressSettings) -> options.Options:
    confdir, upstream_ca = prepare_confdir(settings)
    return options.Options(
        listen_host="127.0.0.1",
        listen_port=0,
        confdir=confdir,
        ssl_verify_upstream_trusted_ca=upstream_ca,
    )


def _redis(settings: EgressSettings) -> Redis | None:
    """Redis, as user `egress` (secrets, grants and allowances read; egress bytes counted)."""
    if not settings.redis_url:
        return None
    login: dict[str, Any] = {}
    if settings.redis_user:
        login = {
            "username": settings.redis_user,
            "password": settings.redis_password.get_secret_value(),
        }
    return Redis.from_url(
        settings.redis_url, socket_timeout=5.0, socket_connect_timeout=5.0, **login
    )


def _fast_paths() -> None:
    """Bytes through with fewer copies and steps: each module says why and when."""
    use_pieces_readers()
    read_larger_pieces()
    read_larger_pieces(PiecesReader)
    write_ahead()
    if not pass_body_pieces():
        log.warning("mitmproxy is not the version body_pieces.py knows: bodies copied as usual")
    if not relay_streamed_bodies():
        log.warning("mitmproxy is not the version body_relay.py knows: bodies through its layers")


async def serve(settings: EgressSettings) -> None:
    os.makedirs(settings.dir, mode=0o755, exist_ok=True)
    links = Links()
    redis = _redis(settings)
    secrets = SecretHeaders.from_settings(settings, redis)
    usage = EgressUsage(redis, settings.activity_interval_s)
    _fast_paths()
    master = Master(_options(settings))
    # Only the addons a proxy of ours needs: mitmproxy calls each addon on every event of every
    # connection, and its default set (playback, export, cookies, maps...) cost a third of a
    # new connection's time here.
    master.addons.add(
        core.Core(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        disable_h2c.DisableH2C(),  # no h2c upgrade past the per-request checks
        errorcheck.ErrorCheck(),
        EgressHandlers(settings, links, secrets),
    )
    # Bodies stream through instead of being held whole (a 1 GB download); an addon's option,
    # known once the master made its addons.
    master.options.update(stream_large_bodies="256k")
    sender = LogSender(settings) if settings.nats_url else None
    activity = Activity(sender.send if sender else None, settings.activity_interval_s)
    sockets = SandboxSockets(settings, links, activity, usage)
    if sender is not None:
        sender.start()
    sending = asyncio.create_task(activity.run())
    counting = asyncio.create_task(usage.run())
    running = asyncio.create_task(master.run())
    while not running.done():
        servers = master.addons.get("proxyserver").servers
        addrs = [a for s in servers for a in (s.listen_addrs or ())]
        if addrs:
            # Sandbox connections are handed to this server instance (handoff.py).
            sockets.proxy = next(iter(servers))
            break
        await asyncio.sleep(0.02)
    health = await serve_health(
        settings.health_host, settings.health_port, lambda: sockets.proxy is not None
    )
    port = health.sockets[0].getsockname()[1]
    log.info(
        "egress proxy %s ready: sandboxes under %s, health on port %s, secrets %s",
        settings.replica,
        settings.dir,
        port,
        "added with the deployment's CA"
        if settings.ca_file and secrets.enabled
        else "not added (needs DECKHANDS_EGRESS_CA_FILE, DECKHANDS_REDIS_URL and "
        "DECKHANDS_SECRETS_KEY)",
    )
    print(f"egress proxy ready health_port={port}", flush=True)
    _collect_less()
    scanning = asyncio.create_task(sockets.run())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await asyncio.wait([running, asyncio.create_task(stop.wait())], return_when="FIRST_COMPLETED")
    scanning.cancel()
    await sockets.close()
    sending.cancel()
    counting.cancel()
    await activity.close()
    with contextlib.suppress(Exception):
        await usage.flush()  # the last second's bytes
    if sender is not None:
        await sender.close()
    if redis is not None:
        await redis.aclose()
    health.close()
    master.shutdown()
    await asyncio.wait([running], timeout=5)


def _collect_less() -> None:
    """mitmproxy makes a few small objects per event of every connection (its commands, its
    layers' generator frames), so the collector's youngest generation filled every few events
    and each full pass walked mitmproxy's 100,000-odd objects of its start: 6 % of the CPU of a
    download. Those are set aside (gc.freeze), and the young generation is collected less often;
    reference counting frees nearly all of it anyway."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # mitmproxy's own lines (each connection's connect and disconnect, four of them) are
    # DEBUG's business: the connection's account is this proxy's line and the task's log.
    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    try:
        settings = EgressSettings()  # type: ignore[call-arg]  # `dir` comes from the environment
    except ValidationError as exc:
        sys.exit(f"egress proxy: bad settings: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}")
    try:
        event_loop.run(serve(settings))
    except ValueError as exc:  # a malformed secrets key or CA file, named
        sys.exit(f"egress proxy: bad settings: {exc}")
