"""A stream without a leader is an outage to wait out, not a poison message."""

from __future__ import annotations

import nats.errors
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from shared.outages import is_jetstream_outage


def _raised_from(cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise RuntimeError("publishing the turn failed") from inner
    except RuntimeError as outer:
        return outer


def test_no_leader_and_unavailable_are_outages() -> None:
    assert is_jetstream_outage(NoStreamResponseError())
    assert is_jetstream_outage(ServiceUnavailableError(code=503))
    assert is_jetstream_outage(APIError(code=503, description="JetStream not available"))
    assert is_jetstream_outage(_raised_from(NoStreamResponseError()))


def test_other_failures_are_not() -> None:
    assert not is_jetstream_outage(ValueError("bad message"))
    assert not is_jetstream_outage(APIError(code=400, description="bad request"))
    # A request nobody answers (storage down) is the handler's failure, counted as such.
    assert not is_jetstream_outage(nats.errors.NoRespondersError())
    assert not is_jetstream_outage(nats.errors.TimeoutError())
