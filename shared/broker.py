"""The one way services build their NATS broker: telemetry, metrics and delivery policy wired in."""

from __future__ import annotations

import logging
import os
from typing import Any

from faststream import AckPolicy
from faststream.nats import ConsumerConfig, JStream, NatsBroker, PullSub
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.security import SASLPlaintext
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY

from .broker_metrics import BoundedNatsPrometheusMiddleware
from .broker_permissions import inbox_prefix
from .delivery import DeliveryGuard
from .health import PROCESS_HEALTH, ProgressMiddleware
from .nats_fetch import install as install_nats_fetch_fix
from .settings import CommonSettings
from .subjects import (
    DELETIONS_STREAM,
    EVENTS_STREAM,
    NOTICES_STREAM,
    ROUTED_STREAM,
    WORK_STREAM,
    Service,
)

__all__ = [
    "DELETIONS",
    "EVENTS",
    "EXIT_BROKER_LOST",
    "NOTICES",
    "ROUTED",
    "WORK",
    "IdleFetchFilter",
    "ServiceBroker",
    "build_broker",
    "durable_subscription",
    "handled_message",
    "nats_login",
]

# The exit status of a service whose NATS connection closed for good (sysexits' EX_SOFTWARE).
EXIT_BROKER_LOST = 70

# Streams are declared by `ensure_streams`; subscribers only name them.
EVENTS = JStream(EVENTS_STREAM, declare=False)
WORK = JStream(WORK_STREAM, declare=False)
DELETIONS = JStream(DELETIONS_STREAM, declare=False)
NOTICES = JStream(NOTICES_STREAM, declare=False)
ROUTED = JStream(ROUTED_STREAM, declare=False)

_MAX_ACK_PENDING = 20_000

# FastStream logs through this logger (which propagates to ours, redaction included).
BROKER_LOG = logging.getLogger("deckhands.broker")


class IdleFetchFilter(logging.Filter):
    """Drops FastStream's 'raised an exception, retrying' record for an idle pull consumer.

    nats-py ends a fetch that found no message with a bare `asyncio.TimeoutError` in one of its
    paths, which FastStream's fetch loop does not suppress (it expects nats' own subclass): its
    supervisor restarts the loop, and logs an ERROR with a traceback. Nothing failed.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        idle = type(exc) is TimeoutError and "raised an exception" in str(record.msg)
        return not idle


BROKER_LOG.addFilter(IdleFetchFilter())
install_nats_fetch_fix()


class ServiceBroker(NatsBroker):
    """A service's broker: a connection that closes while the service runs ends the process.

    nats-py reconnects after a network loss, but some closes are final (the server refusing a
    message over its max_payload ends the connection without a reconnect). A service that lived
    on would answer its health checks and do nothing; exiting lets its supervisor (Kubernetes,
    `make up`'s restart) start it again, and every unacknowledged message is redelivered.
    """

    stopping = False
    # The delivery policy, for handlers that settle a batch's messages one by one.
    guard: DeliveryGuard

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        self.stopping = True  # our own close: not a loss
        await super().stop(*args, **kwargs)

    async def connection_closed(self) -> None:
        if self.stopping:
            return
        BROKER_LOG.critical(
            "the NATS connection is closed for good; exiting (status %d) so that the service "
            "is started again",
            EXIT_BROKER_LOST,
        )
        logging.shutdown()
        os._exit(EXIT_BROKER_LOST)


def build_broker(
    settings: CommonSettings, service: Service, tracer_provider: TracerProvider | None = None
) -> ServiceBroker:
    guard = DeliveryGuard(
        service,
        max_deliveries=settings.max_deliveries,
        backoff_s=settings.retry_backoff_s,
        backoff_max_s=settings.retry_backoff_max_s,
    )
    holder: list[ServiceBroker] = []

    async def closed() -> None:
        if holder:
            await holder[0].connection_closed()

    middlewares: list[Any] = [
        ProgressMiddleware,  # first, so a message the guard dead-letters counts as progress
        guard,
    ]
    if settings.otel_exporter != "none":
        # With no exporter no span is ever recorded (the sampler drops them all), and the
        # tracing middleware would only carry a trace id from message to message for nobody:
        # about a sixth of FastStream's CPU per message consumed.
        middlewares.append(NatsTelemetryMiddleware(tracer_provider=tracer_provider))
    middlewares.append(
        BoundedNatsPrometheusMiddleware(registry=REGISTRY, app_name=f"deckhands-{service.value}")
    )
    broker = ServiceBroker(
        settings.nats_servers,
        name=f"deckhands-{service.value}",
        **nats_login(settings),
        middlewares=middlewares,
        max_reconnect_attempts=-1,
        logger=BROKER_LOG,
        # A line per message received and processed: DEBUG, not what an operator reads.
        log_level=logging.DEBUG,
        closed_cb=closed,
        disconnected_cb=PROCESS_HEALTH.disconnected,
        reconnected_cb=PROCESS_HEALTH.reconnected,
    )
    broker.guard = guard
    holder.append(broker)
    PROCESS_HEALTH.watch(broker)
    return broker


def handled_message(broker: NatsBroker) -> Any:
    """The message (FastStream's StreamMessage) the running handler was called for.

    Handlers read it here rather than take a `NatsMessage` (a `Context`) parameter: fast_depends
    resolves each such parameter in a worker thread, a thread hop and a lock on every message of
    the hottest paths (the runtime's, the reasoner's, storage's)."""
    message = broker.context.get_local("message")
    if message is None:
        raise RuntimeError("no message is being handled in this context")
    return message


def nats_login(settings: CommonSettings) -> dict[str, Any]:
    """Connection options for the service's NATS user: its password, and its own inbox prefix
    (the only reply subjects its user may subscribe to). None: an unlocked server."""
    if not settings.nats_user:
        return {}
    return {
        "security": SASLPlaintext(
            username=settings.nats_user, password=settings.nats_password.get_secret_value()
        ),
        "inbox_prefix": inbox_prefix(settings.nats_user),
    }


# Messages one fetch of a concurrent consumer may bring: a burst's round trips, against how
# long a fetched message may wait for a free worker while its ack_wait runs.
_MAX_FETCH = 32


def durable_subscription(
    settings: CommonSettings,
    stream: JStream,
    durable: str,
    *,
    workers: int = 1,
    batch_size: int | None = None,
    batch_wait_s: float = 0.1,
    inactive_s: float | None = None,
) -> dict[str, Any]:
    """Keyword arguments for `broker.subscriber`: a pull consumer shared by every replica.

    With `batch_size`, the handler gets up to that many messages at once (a list; FastStream's
    per-message work is paid once per batch) and settles each of them itself, with the
    broker's `guard`; batches are handled one at a time (FastStream has no concurrent batches),
    so `workers` must stay 1. FastStream waits up to `batch_wait_s` to fill a batch: that is
    how late a message may be handled when messages come one by one.

    With `inactive_s`, the server removes the consumer once no client has used it for that long
    (a consumer named for one replica, whose replica may be gone for good)."""
    pull: PullSub[Any]
    if batch_size is not None:
        if workers != 1:
            raise ValueError("a batch subscription handles one batch at a time (workers=1)")
        pull = PullSub(batch_size=batch_size, timeout=batch_wait_s, batch=True)
    else:
        # Up to _MAX_FETCH messages per fetch. One per fetch cost a round trip per message:
        # when 300 tasks' step requests came at once, the reasoner fetched them one by one on
        # an event loop busy with 300 LLM calls, and the last waited 10-30 s in the stream. A
        # fetch of many returns at once with what is there, or with the first message to come
        # (nats-py >= 2.16 with nats-server 2.15; tests/integration/test_pull_fetch.py holds
        # both, since an older pairing held a lone message for the rest of the batch). The
        # handler still runs `workers` messages at once.
        pull = PullSub(batch_size=min(workers, _MAX_FETCH), timeout=1.0)
    return {
        "stream": stream,
        "durable": durable,
        "pull_sub": pull,
        "max_workers": workers,
        "ack_policy": AckPolicy.MANUAL,
        # FastStream's pull subscriber takes its fetch inbox from here, not from the connection.
        **(
            {"inbox_prefix": f"{inbox_prefix(settings.nats_user)}.".encode()}
            if settings.nats_user
            else {}
        ),
        # The guard bounds deliveries itself; the server must never drop a message silently.
        "config": ConsumerConfig(
            durable_name=durable,
            ack_wait=settings.ack_wait_s,
            max_deliver=-1,
            # Hundreds of tasks' orders may be in flight at once (long commands, LLM calls,
            # orders waiting for a sandbox): the server's default of 1000 would stall them all.
            max_ack_pending=_MAX_ACK_PENDING,
            inactive_threshold=inactive_s,
        ),
    }
