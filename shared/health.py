"""A worker's /healthz and /readyz, served next to /metrics on DECKHANDS_METRICS_PORT.

- **Liveness** (`/healthz`): the event loop answers within `health_deadline_s`, the NATS
  connection is not closed, and it has not been down for longer than
  `health_reconnect_grace_s` (a client that never gets back to a server that is back is
  stuck; a restart fixes that, while a short broker outage must not restart every worker).
- **Readiness** (`/readyz`): connected to NATS, and every durable consumer of the process
  makes progress: a consumer whose stream holds messages nobody has been given yet
  (`num_pending` > 0) while this process has neither received nor finished a message of it for
  `health_stall_s` is stalled. An idle consumer (nothing pending) is always ready.

The HTTP server runs in threads (as prometheus_client's does), so /metrics answers even when
the event loop is busy; the health answers themselves are computed *on* the event loop, so a
wedged loop fails both probes (503 after the deadline) instead of a thread saying all is well.

Two gauges come from here for the alerts (deploy/prometheus/alerts.yml): each durable
consumer's `num_pending` (`deckhands_consumer_pending`, refreshed every
`CONSUMER_GAUGE_REFRESH_S` and by every readiness probe) and whether this process' NATS
connection is up (`deckhands_nats_connected`, read at scrape time).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from faststream import BaseMiddleware
from nats.aio.msg import Msg
from prometheus_client import REGISTRY, Gauge, Histogram, make_wsgi_app

from .periodic import every

__all__ = [
    "CONSUMER_GAUGE_REFRESH_S",
    "CONSUMER_PENDING",
    "NATS_CONNECTED",
    "PROCESS_HEALTH",
    "HealthMonitor",
    "HealthReport",
    "ProgressMiddleware",
    "serve_metrics_and_health",
]

log = logging.getLogger("deckhands.health")

# Every replica of a service reports the same consumer's figure: dashboards and alerts take the
# max per (stream, consumer). The labels are stream and durable names, a handful per system.
CONSUMER_PENDING = Gauge(
    "deckhands_consumer_pending",
    "Messages of a durable JetStream consumer not yet delivered to anyone (num_pending)",
    ["stream", "consumer"],
)
NATS_CONNECTED = Gauge(
    "deckhands_nats_connected", "1 while this process' NATS connection is up, else 0"
)
# Often enough for a scrape every 15 s to see a queue build up; one small request per consumer.
CONSUMER_GAUGE_REFRESH_S = 5.0


@dataclass
class HealthReport:
    ok: bool
    checks: dict[str, str]

    def body(self) -> bytes:
        status = "ok" if self.ok else "fail"
        failed = [f"{name}: {result}" for name, result in self.checks.items() if not _ok(result)]
        document: dict[str, Any] = {"status": status, "checks": self.checks}
        if failed:
            document["detail"] = "; ".join(failed)
        return json.dumps(document).encode()


def _ok(result: str) -> bool:
    return result == "ok" or result.startswith("ok ")


@dataclass
class _ConsumerProgress:
    last_progress: float
    in_flight: int = 0


@dataclass
class HealthMonitor:
    """What the probes look at: the broker and each consumer's last sign of progress."""

    stall_s: float = 120.0
    reconnect_grace_s: float = 300.0
    deadline_s: float = 1.5
    broker: Any = None
    clock: Callable[[], float] = time.monotonic
    started_at: float = field(default_factory=time.monotonic)
    down_since: float | None = None
    _consumers: dict[str, _ConsumerProgress] = field(default_factory=dict)
    _gauge_refresh: asyncio.Task[None] | None = None

    def configure(self, *, stall_s: float, reconnect_grace_s: float, deadline_s: float) -> None:
        self.stall_s, self.reconnect_grace_s = stall_s, reconnect_grace_s
        self.deadline_s = deadline_s

    def watch(self, broker: Any) -> None:
        self.broker = broker
        self.started_at = self.clock()

    # --- hooks: the broker's connection callbacks and ProgressMiddleware ----------------------

    async def disconnected(self) -> None:
        if self.down_since is None:
            self.down_since = self.clock()

    async def reconnected(self) -> None:
        self.down_since = None

    def _progress(self, consumer: str) -> _ConsumerProgress:
        progress = self._consumers.get(consumer)
        if progress is None:
            progress = self._consumers[consumer] = _ConsumerProgress(self.clock())
        return progress

    def received(self, consumer: str) -> None:
        progress = self._progress(consumer)
        progress.in_flight += 1
        progress.last_progress = self.clock()

    def finished(self, consumer: str) -> None:
        progress = self._progress(consumer)
        progress.in_flight = max(0, progress.in_flight - 1)
        progress.last_progress = self.clock()

    # --- the checks, run on the event loop --------------------------------------------------

    def _connection(self) -> Any:
        try:
            return self.broker.connection if self.broker is not None else None
        except Exception:  # FastStream raises before its first connect
            return None

    def nats_connected(self) -> float:
        """For NATS_CONNECTED, read by the metrics thread: only attributes, no event loop."""
        connection = self._connection()
        return 1.0 if connection is not None and connection.is_connected else 0.0

    def _nats_check(self) -> tuple[str, bool]:
        """(what to report, whether liveness holds)."""
        connection = self._connection()
        if connection is None:
            return "not connected yet (starting)", True
        if connection.is_closed:
            return "connection closed", False
        if connection.is_connected:
            self.down_since = None
            return "ok", True
        if self.down_since is None:
            self.down_since = self.clock()
        down_for = self.clock() - self.down_since
        within_grace = down_for <= self.reconnect_grace_s
        return (
            f"disconnected for {down_for:.0f}s, reconnecting (liveness fails after "
            f"{self.reconnect_grace_s:.0f}s)",
            within_grace,
        )

    async def liveness(self) -> HealthReport:
        nats_result, alive = self._nats_check()
        return HealthReport(alive, {"event_loop": "ok", "nats": _as_ok(nats_result, alive)})

    def _durable_consumers(self) -> Iterable[tuple[str, str]]:
        for subscriber in getattr(self.broker, "subscribers", ()):
            stream = getattr(subscriber, "stream", None)
            durable = getattr(getattr(subscriber, "config", None), "durable_name", None)
            if stream is not None and durable:
                yield stream.name, durable

    async def _pending(self, stream: str, durable: str) -> int:
        info = await self.broker.connection.jetstream().consumer_info(stream, durable)
        pending = int(info.num_pending or 0)
        CONSUMER_PENDING.labels(stream, durable).set(pending)
        return pending

    async def refresh_consumer_gauges(self) -> None:
        """One round of CONSUMER_PENDING for every durable consumer (none while disconnected:
        the gauges keep their last figure, and deckhands_nats_connected says why)."""
        connection = self._connection()
        if connection is None or not connection.is_connected:
            return
        for stream, durable in list(self._durable_consumers()):
            async with asyncio.timeout(self.deadline_s):
                await self._pending(stream, durable)

    def start_gauge_refresh(self) -> None:
        """Start the refresh rounds on the running loop, once per monitor."""
        if self._gauge_refresh is None:
            self._gauge_refresh = asyncio.get_running_loop().create_task(
                every(
                    CONSUMER_GAUGE_REFRESH_S, self.refresh_consumer_gauges, "consumer gauges", log
                )
            )

    async def _consumer_check(self, stream: str, durable: str) -> str:
        pending = await self._pending(stream, durable)
        progress = self._consumers.get(durable)
        last = progress.last_progress if progress is not None else self.started_at
        in_flight = progress.in_flight if progress is not None else 0
        quiet_for = self.clock() - last
        if pending > 0 and quiet_for > self.stall_s:
            return (
                f"stalled: {pending} messages waiting and none received or finished here for "
                f"{quiet_for:.0f}s ({in_flight} in flight)"
            )
        return f"ok ({pending} waiting, {in_flight} in flight)"

    async def _consumer_check_within_deadline(self, stream: str, durable: str) -> str:
        try:
            async with asyncio.timeout(self.deadline_s):
                return await self._consumer_check(stream, durable)
        except TimeoutError:
            return f"no consumer info from NATS within {self.deadline_s}s"
        except Exception as exc:
            return f"consumer info failed: {type(exc).__name__}: {exc}"

    async def readiness(self) -> HealthReport:
        nats_result, _ = self._nats_check()
        checks = {"event_loop": "ok", "nats": nats_result}
        if nats_result == "ok":
            consumers = list(self._durable_consumers())
            results = await asyncio.gather(
                *(self._consumer_check_within_deadline(s, d) for s, d in consumers)
            )
            checks.update(
                (f"consumer {d}", r) for (_, d), r in zip(consumers, results, strict=True)
            )
        return HealthReport(all(_ok(result) for result in checks.values()), checks)


def _as_ok(result: str, ok: bool) -> str:
    """A passing check reads "ok" or "ok (why)", so that the report is read the same way."""
    if not ok or _ok(result):
        return result
    return f"ok ({result})"


# Like prometheus_client's REGISTRY: one per process, filled in by build_broker.
PROCESS_HEALTH = HealthMonitor()
# Every process with a broker (the gateway too, which serves no probes here) reports it.
NATS_CONNECTED.set_function(PROCESS_HEALTH.nats_connected)


CONSUMER_WAIT = Histogram(
    "deckhands_consumer_wait_seconds",
    "Per durable consumer: from a message's arrival in its stream to the start of its handling "
    "(how far the consumer lags; a redelivery counts from the first arrival)",
    ["consumer"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


class ProgressMiddleware(BaseMiddleware):
    """Records, per durable consumer, that a message arrived, how long it waited in its stream,
    and that its handling ended."""

    monitor: HealthMonitor = PROCESS_HEALTH

    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        raw = msg.raw_message
        meta = _metadata_of(raw)
        if meta is None:
            return await call_next(msg)
        consumer = str(meta.consumer)
        CONSUMER_WAIT.labels(consumer).observe(max(0.0, time.time() - meta.timestamp.timestamp()))
        self.monitor.received(consumer)
        try:
            return await call_next(msg)
        finally:
            self.monitor.finished(consumer)


def _metadata_of(raw: Any) -> Msg.Metadata | None:
    if not isinstance(raw, Msg) or not raw.reply or not raw.reply.startswith("$JS.ACK"):
        return None
    try:
        return raw.metadata
    except Exception:
        return None


# --- the HTTP server --------------------------------------------------------------------------


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds are not worth a log line each."""


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def _answer(
    loop: asyncio.AbstractEventLoop, check: Callable[[], Any], deadline_s: float
) -> HealthReport:
    """Run `check` on the event loop; a loop that does not answer in time is not healthy.

    The coroutine is created on the loop itself, so a probe given up on before the loop got to
    it leaves no never-awaited coroutine behind.
    """
    answer: Future[HealthReport] = Future()

    def start() -> None:
        if not answer.set_running_or_notify_cancel():
            return
        task = loop.create_task(check())

        def done(task: asyncio.Task[HealthReport]) -> None:
            if task.cancelled():
                answer.set_exception(TimeoutError())
            elif task.exception() is not None:
                answer.set_exception(task.exception())
            else:
                answer.set_result(task.result())

        task.add_done_callback(done)

    loop.call_soon_threadsafe(start)
    try:
        return answer.result(timeout=deadline_s)
    except TimeoutError:
        answer.cancel()
        return HealthReport(False, {"event_loop": f"did not answer within {deadline_s}s"})
    except Exception as exc:
        return HealthReport(False, {"event_loop": f"check failed: {type(exc).__name__}: {exc}"})


def _health_app(
    monitor: HealthMonitor, loop: asyncio.AbstractEventLoop, metrics_app: Callable[..., Any]
) -> Callable[..., Any]:
    checks = {"/healthz": monitor.liveness, "/readyz": monitor.readiness}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        check = checks.get(environ.get("PATH_INFO", ""))
        if check is None:
            result: Iterable[bytes] = metrics_app(environ, start_response)
            return result
        # Readiness asks NATS about the consumers within the deadline itself, so the loop
        # gets twice as long to hand back its answer; liveness only needs the loop to answer.
        deadline = monitor.deadline_s * (2 if check is monitor.readiness else 1)
        report = _answer(loop, check, deadline)
        body = report.body()
        start_response(
            "200 OK" if report.ok else "503 Service Unavailable",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return app


def serve_metrics_and_health(
    port: int, loop: asyncio.AbstractEventLoop, monitor: HealthMonitor = PROCESS_HEALTH
) -> WSGIServer:
    """/metrics, /healthz and /readyz on `port` (all addresses), in daemon threads; and the
    consumer gauges' refresh rounds on `loop`."""
    NATS_CONNECTED.set_function(monitor.nats_connected)
    loop.call_soon_threadsafe(monitor.start_gauge_refresh)
    server = make_server(
        "0.0.0.0",
        port,
        _health_app(monitor, loop, make_wsgi_app(REGISTRY)),
        _ThreadingWSGIServer,
        handler_class=_SilentHandler,
    )
    Thread(target=server.serve_forever, name="metrics-and-health", daemon=True).start()
    return server
