"""The egress proxy's connection to NATS: each task's connections go to the controller, which
logs them (activity.py). Connected in the background, so that the proxy relays from its start
whether NATS is up or not; an entry sent while it is not connected is refused (and counted)."""

from __future__ import annotations

import asyncio
import logging

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

from shared.broker_permissions import inbox_prefix
from shared.events import EgressActivityObservation
from shared.subjects import Service, work_subject

from .settings import EgressSettings

__all__ = ["LogSender"]

log = logging.getLogger("deckhands.egress")


class LogSender:
    def __init__(self, settings: EgressSettings) -> None:
        self.settings = settings
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._connecting: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._connecting = asyncio.create_task(self._connect())

    async def _connect(self) -> None:
        s = self.settings
        user = s.nats_user or None
        while True:
            try:
                self._client = await nats.connect(
                    servers=s.nats_url.split(","),
                    user=user,
                    password=s.nats_password.get_secret_value() or None,
                    inbox_prefix=inbox_prefix(user) if user else "_INBOX",
                    name=f"egress-{s.replica}",
                    max_reconnect_attempts=-1,
                    connect_timeout=5,
                )
                self._js = self._client.jetstream()
                log.info("connected to NATS: connections go to each task's log")
                return
            except Exception as exc:
                log.warning("cannot reach NATS (%s); trying again in 2 s", exc)
                await asyncio.sleep(2)

    async def send(self, entry: EgressActivityObservation) -> None:
        if self._js is None:
            raise ConnectionError("not connected to NATS yet")
        await self._js.publish(
            work_subject(Service.CONTROLLER, entry.task_id),
            entry.model_dump_json().encode(),
            headers={"Nats-Msg-Id": entry.id},
            timeout=5,
        )

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        if self._client is not None and not self._client.is_closed:
            await self._client.drain()
