"""Bounds on what one HTTP client can make the gateway hold: body bytes, header bytes, and time.

- `BodyLimitMiddleware` (ASGI): a body over the limit is answered 413 with a JSON error naming
  the limit. A declared Content-Length over it is refused before a byte of the body is read; a
  chunked body is counted while it streams in and refused as soon as it passes, so a 50 MB body
  never sits in memory. The answer closes the connection (the rest of the body is not read).
- `bounded_h11_protocol` (uvicorn's h11 protocol, subclassed): a request (headers and body) not
  received in full within `request_timeout_s` of its first byte, or of the connection opening,
  is answered 408 and its connection closed, so connections that never finish their request
  cannot pile up. Headers past h11's size limit get 431 instead of uvicorn's bare 400. Idle
  keep-alive connections are closed by uvicorn's own `timeout_keep_alive`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..metrics import REFUSED_REQUESTS

__all__ = ["BodyLimitMiddleware", "bounded_h11_protocol"]

log = logging.getLogger("deckhands.gateway")

_BODY_VARIABLE = "DECKHANDS_MAX_REQUEST_BODY_BYTES"
# Uploads into a task's workspace (PUT /v1/tasks/{id}/workspace) stream to a temporary file,
# never into memory: they get their own, larger, body limit and deadline.
UPLOAD_PATH = re.compile(r"^/v1/tasks/[^/]+/workspace$")
_UPLOAD_VARIABLE = "DECKHANDS_WORKSPACE_MAX_UPLOAD_BYTES"


def _is_upload(method: str | bytes, path: str | bytes) -> bool:
    method = method.decode("latin-1") if isinstance(method, bytes) else method
    path = path.decode("latin-1") if isinstance(path, bytes) else path
    return method == "PUT" and UPLOAD_PATH.match(path.split("?", 1)[0]) is not None


_CLOSE = (b"connection", b"close")


def _json_error(status: int, reason: str, detail: str) -> bytes:
    """A complete HTTP/1.1 response, written straight to the socket (no h11 state needed)."""
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, max_upload_bytes: int | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes or max_body_bytes

    def _detail(self, size: str, limit: int, variable: str) -> str:
        return f"request body {size} is larger than the limit of {limit} bytes ({variable})"

    async def _refuse(self, send: Send, size: str, upload: bool = False) -> None:
        REFUSED_REQUESTS.labels("body").inc()
        limit = self.max_upload_bytes if upload else self.max_body_bytes
        variable = _UPLOAD_VARIABLE if upload else _BODY_VARIABLE
        body = json.dumps({"detail": self._detail(size, limit, variable)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    _CLOSE,  # the rest of the body is not read: the connection cannot be reused
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        upload = _is_upload(scope["method"], scope["path"])
        limit = self.max_upload_bytes if upload else self.max_body_bytes
        if declared is not None and declared > limit:
            await self._refuse(send, f"of {declared} bytes (Content-Length)", upload)
            return

        received = 0
        too_large = False
        answered = False  # a response has started: ours (413) or the app's

        async def counting_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def refusing_send(message: Message) -> None:
            # FastAPI turns an error while reading the body into its own 400: once the body is
            # known to be too large, whatever the app answers is replaced by the 413.
            nonlocal answered
            if too_large:
                if not answered:
                    answered = True
                    await self._refuse(send, f"of more than {limit} bytes", upload)
                return
            if message["type"] == "http.response.start":
                answered = True
            await send(message)

        try:
            await self.app(scope, counting_receive, refusing_send)
        except _BodyTooLarge:
            pass  # raised only by counting_receive: answered just below
        if too_large and not answered:
            await self._refuse(send, f"of more than {limit} bytes", upload)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # h11 refuses such a request before it gets here
    return None


# After refusing a request whose body is still coming, how long its bytes are read and dropped
# before the connection is closed: closing a socket with unread data sends a reset, and a
# client busy uploading would lose the answer it has not read yet.
LINGER_S = 2.0


class _LingeringTransport:
    """The connection's transport, with a close that lets the client read our answer first:
    the write side is shut (the client sees the answer, then end of file), what still arrives
    is dropped, and the socket closes after LINGER_S."""

    def __init__(self, transport: asyncio.Transport, protocol: _BoundedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.lingering:
            return
        client_still_sending = self._protocol.conn.their_state in (h11.SEND_BODY, h11.IDLE)
        if not client_still_sending or self._transport.is_closing():
            self._transport.close()
            return
        self.lingering = True
        try:
            self._transport.write_eof()
        except (OSError, RuntimeError):
            self._transport.close()
            return
        self._protocol.loop.call_later(LINGER_S, self._transport.close)


def _head_bytes(request: h11.Request) -> int:
    return len(request.target) + sum(len(name) + len(value) + 4 for name, value in request.headers)


class _BoundedH11Protocol(H11Protocol):
    request_timeout_s: float = 30.0
    upload_timeout_s: float = 30.0
    max_header_bytes: int = 16 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_timer: asyncio.TimerHandle | None = None
        self._refusal_hint: int | None = None
        next_event = self.conn.next_event

        def next_event_noting_why() -> Any:
            try:
                event = next_event()
                if isinstance(event, h11.Request) and _head_bytes(event) > self.max_header_bytes:
                    # h11 bounds only a head still incomplete after a read; one read can bring
                    # a larger, complete one.
                    raise h11.RemoteProtocolError("headers too large", error_status_hint=431)
                if isinstance(event, h11.Request) and _is_upload(event.method, event.target):
                    self._arm(self.upload_timeout_s)  # an upload's body takes longer
                return event
            except h11.RemoteProtocolError as exc:
                # uvicorn answers every protocol error 400; h11 knows when it is 431.
                self._refusal_hint = exc.error_status_hint
                raise

        self.conn.next_event = next_event_noting_why  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        lingering: Any = _LingeringTransport(transport, self)
        super().connection_made(lingering)
        self._arm()  # a connection that says nothing is held no longer than a slow request

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused and lingering: the rest of the body is dropped unread
        if self._request_timer is None:
            self._arm()  # a new request starts with its first byte
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._disarm()  # the whole request is in: streaming the answer has no deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Keep-alive: the next request's clock starts with its first byte.
        if self.conn.their_state is h11.IDLE:
            self._disarm()

    def send_400_response(self, msg: str) -> None:
        if self._refusal_hint != 431:
            super().send_400_response(msg)
            return
        REFUSED_REQUESTS.labels("headers").inc()
        self.transport.write(
            _json_error(
                431,
                "Request Header Fields Too Large",
                f"request headers are larger than the limit of {self.max_header_bytes} bytes "
                "(DECKHANDS_MAX_REQUEST_HEADER_BYTES)",
            )
        )
        self.transport.close()

    def _arm(self, timeout_s: float | None = None) -> None:
        self._disarm()
        self._request_timer = self.loop.call_later(
            timeout_s or self.request_timeout_s, self._timed_out
        )

    def _disarm(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _timed_out(self) -> None:
        self._request_timer = None
        if self.transport.is_closing():
            return
        REFUSED_REQUESTS.labels("request_timeout").inc()
        log.debug("closing a connection from %s: request not complete in time", self.client)
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(
                _json_error(
                    408,
                    "Request Timeout",
                    f"the request was not received in full within {self.request_timeout_s} s "
                    "(DECKHANDS_REQUEST_TIMEOUT_S)",
                )
            )
        # The app, if it was reading the body, sees the client disconnect.
        self.transport.close()


def bounded_h11_protocol(
    *, request_timeout_s: float, max_header_bytes: int, upload_timeout_s: float | None = None
) -> type[H11Protocol]:
    """uvicorn's `http=` protocol class with these limits."""
    return type(
        "BoundedH11Protocol",
        (_BoundedH11Protocol,),
        {
            "request_timeout_s": request_timeout_s,
            "upload_timeout_s": upload_timeout_s or request_timeout_s,
            "max_header_bytes": max_header_bytes,
        },
    )
