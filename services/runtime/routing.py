"""Orders routed to one runtime replica: passed on to the replica holding a task's sandbox, and
handed back to every replica when theirs is gone.

A task's sandbox lives on one Docker engine, reached by the replicas of one name (a node's
runtime, or processes sharing an engine). The controller sends a task's orders to the queue of
the replica its last observation named (`deckhands.routed.runtime.<replica>.<task>`, stream
ROUTED), and the others (a first order, a State rebuilt from the log) to the shared queue
(`deckhands.work.runtime.<task>`). A replica given an order for a sandbox that another replica,
alive, holds passes it on to that replica's queue (`forward`).

A replica that is gone (no heartbeat of its name for `replica_ttl_s`, and as long again: a
Redis that lost its keys is not taken for a dead replica, its replicas send one within a third
of it) strands nothing: every replica looks for queues of gone replicas that hold orders
(`drain_gone`) and passes those orders back to the shared queue, under an id made of the
message's place in the stream (a drain redelivered after a crash publishes the same id, and
JetStream keeps one copy). The replica taking one then adopts the sandbox (an engine it shares)
or reports the workspace lost (another engine): the task's next action runs in a fresh sandbox.
An action the gone replica had begun is reported interrupted by the action ledger, never run
again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from shared.publishing import publish_json
from shared.subjects import (
    ROUTED_STREAM,
    WORK_STREAM,
    Service,
    replica_of_routed,
    routed_subject,
    work_subject,
)

from .bindings import TaskBindings
from .metrics import ORDERS_RELAYED

__all__ = ["QUEUE_INACTIVE_S", "ReplicaQueues", "consumer_name", "relay_id"]

log = logging.getLogger("deckhands.runtime.routing")

_DRAIN_BATCH = 64
# A replica's queue consumer unused this long is removed by NATS (a node gone for good); its
# orders stay in the stream for a drain, which makes it again.
QUEUE_INACTIVE_S = 86_400.0
_MAX_ACK_PENDING = 20_000


def consumer_name(replica: str) -> str:
    """The durable consumer of a replica's queue (ROUTED stream)."""
    return f"runtime_{replica}"


def relay_id(order_id: str, stream: str, stream_seq: int) -> str:
    """The Nats-Msg-Id of an order passed on: its place in the stream it came from, so that
    passing the same message on again (a redelivery) is one copy, and the order passed on a
    second time later (a second hop) is another."""
    return f"{order_id}.{stream}.{stream_seq}"


class ReplicaQueues:
    def __init__(
        self,
        broker: object,
        jetstream: Callable[[], JetStreamContext],
        replica: str,
        ttl_s: float,
        ack_wait_s: float,
        inbox: bytes | None = None,
    ) -> None:
        self.broker = broker
        self.jetstream = jetstream
        self.replica = replica
        self.ttl_s = ttl_s
        self.ack_wait_s = ack_wait_s
        self.inbox = inbox  # the connection's reply prefix (its NATS user may use no other)
        self._silent_since: dict[str, float] = {}

    async def forward(self, task_id: str, payload: str, to: str, msg_id: str) -> None:
        """Put an order into the queue of replica `to`."""
        await publish_json(
            self.broker,  # type: ignore[arg-type]
            routed_subject(Service.RUNTIME, to, task_id),
            payload,
            msg_id,
            ROUTED_STREAM,
        )
        ORDERS_RELAYED.labels("passed_on").inc()

    async def queued_replicas(self) -> set[str]:
        """The replicas whose queue holds orders (delivered or not)."""
        info = await self.jetstream().stream_info(
            ROUTED_STREAM, subjects_filter=routed_subject(Service.RUNTIME)
        )
        return {replica_of_routed(subject) for subject in (info.state.subjects or {})}

    async def drain_gone(self, bindings: TaskBindings) -> int:
        """Pass the orders queued for replicas gone for `2 * ttl_s` back to the shared queue."""
        now = time.monotonic()
        drained = 0
        queued = await self.queued_replicas()
        for replica in sorted(queued - {self.replica}):
            if await bindings.name_alive(replica):
                self._silent_since.pop(replica, None)
                continue
            since = self._silent_since.setdefault(replica, now)
            if now - since < self.ttl_s:
                continue
            drained += await self._drain(replica)
        for replica in set(self._silent_since) - queued:
            del self._silent_since[replica]
        return drained

    async def _drain(self, replica: str) -> int:
        js = self.jetstream()
        subscription = await js.pull_subscribe(
            routed_subject(Service.RUNTIME, replica),
            durable=consumer_name(replica),
            stream=ROUTED_STREAM,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=self.ack_wait_s,
                max_deliver=-1,
                max_ack_pending=_MAX_ACK_PENDING,
                inactive_threshold=QUEUE_INACTIVE_S,
            ),
            inbox_prefix=self.inbox,
        )
        drained = 0
        try:
            while True:
                try:
                    messages = await subscription.fetch(_DRAIN_BATCH, timeout=1.0)
                except (TimeoutError, NatsTimeout, NotFoundError):
                    break
                for msg in messages:
                    await self._hand_back(msg.subject, msg.data, msg.metadata.sequence.stream)
                    await msg.ack()
                    drained += 1
        finally:
            await subscription.unsubscribe()
        if drained:
            log.warning(
                "runtime replica %s is gone: %d orders queued for it handed to every replica",
                replica,
                drained,
            )
        return drained

    async def _hand_back(self, subject: str, data: bytes, stream_seq: int) -> None:
        task_id = subject.rsplit(".", 1)[-1]
        try:
            order_id = str(json.loads(data)["id"])
        except (ValueError, KeyError, TypeError):
            order_id = "unreadable"  # the shared queue's delivery guard dead-letters it
        await publish_json(
            self.broker,  # type: ignore[arg-type]
            work_subject(Service.RUNTIME, task_id),
            data.decode(errors="replace"),
            relay_id(order_id, ROUTED_STREAM, stream_seq),
            WORK_STREAM,
        )
        ORDERS_RELAYED.labels("handed_back").inc()
