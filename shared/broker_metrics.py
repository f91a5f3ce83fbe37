"""FastStream's Prometheus middleware with bounded labels.

Its `handler` label is the message's subject, and ours name a task
(`deckhands.work.controller.<task id>`, `deckhands.events.<task id>`, `deckhands.notices.<task
id>`, `deckhands.routed.runtime.<replica>.<task id>`, reply inboxes): one series
per task, for ever. Here the subject becomes its pattern, so every label stays bounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from faststream.nats.prometheus.provider import (
    BatchNatsMetricsSettingsProvider,
    NatsMetricsSettingsProvider,
    settings_provider_factory,
)
from faststream.prometheus import ConsumeAttrs, MetricsSettingsProvider
from faststream.prometheus.middleware import PrometheusMiddleware
from nats.aio.msg import Msg

if TYPE_CHECKING:
    from faststream.message.message import StreamMessage
    from faststream.response import PublishCommand
    from prometheus_client import CollectorRegistry

__all__ = ["BoundedNatsPrometheusMiddleware", "subject_pattern"]

_PER_TASK = ("deckhands.work.", "deckhands.events.")


def subject_pattern(subject: str) -> str:
    """`deckhands.work.<service>.<task>` -> `deckhands.work.<service>.*`, and the like."""
    if subject.startswith("deckhands.work."):
        return ".".join(subject.split(".")[:3]) + ".*"
    if subject.startswith("deckhands.events."):
        return "deckhands.events.*"
    if subject.startswith("deckhands.notices."):
        return "deckhands.notices.*"
    if subject.startswith("deckhands.routed."):
        # deckhands.routed.runtime.<replica>.<task>: one series per replica, not per task.
        return ".".join(subject.split(".")[:4]) + ".*"
    if subject.startswith(("_INBOX.", "$JS.")):
        return subject.split(".", 1)[0] + ".*"
    return subject


class _BoundedProvider(NatsMetricsSettingsProvider):
    __slots__ = ()

    def get_consume_attrs_from_message(self, msg: StreamMessage[Msg]) -> ConsumeAttrs:
        attrs = super().get_consume_attrs_from_message(msg)
        attrs["destination_name"] = subject_pattern(attrs["destination_name"])
        return attrs

    def get_publish_destination_name_from_cmd(self, cmd: PublishCommand) -> str:
        return subject_pattern(super().get_publish_destination_name_from_cmd(cmd))


class _BoundedBatchProvider(BatchNatsMetricsSettingsProvider):
    """A batch (storage's consumer) is labelled by its first message's subject: bounded too."""

    __slots__ = ()

    def get_consume_attrs_from_message(self, msg: StreamMessage[list[Msg]]) -> ConsumeAttrs:
        attrs = super().get_consume_attrs_from_message(msg)
        attrs["destination_name"] = subject_pattern(attrs["destination_name"])
        return attrs

    def get_publish_destination_name_from_cmd(self, cmd: PublishCommand) -> str:
        return subject_pattern(super().get_publish_destination_name_from_cmd(cmd))


def _bounded_provider(msg: Msg | Sequence[Msg] | None) -> MetricsSettingsProvider[Any] | None:
    provider = settings_provider_factory(msg)
    if isinstance(provider, BatchNatsMetricsSettingsProvider):
        return _BoundedBatchProvider()
    return _BoundedProvider() if isinstance(provider, NatsMetricsSettingsProvider) else provider


class BoundedNatsPrometheusMiddleware(PrometheusMiddleware[Any, Any]):
    def __init__(self, *, registry: CollectorRegistry, app_name: str) -> None:
        super().__init__(
            settings_provider_factory=_bounded_provider,
            registry=registry,
            app_name=app_name,
        )
