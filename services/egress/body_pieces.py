"""A body of known length streamed through mitmproxy's HTTP/1 layer piece by piece, uncopied.

mitmproxy's HTTP/1 connection appends each piece it reads to its receive buffer, h11's body
reader slices it out again, and mitmproxy copies that slice into bytes: three copies of every
byte of a plain-HTTP download or upload, on top of the socket's own. When the buffer is empty
and a piece is wholly inside a Content-Length body (not its last byte), that piece is exactly
what those three steps would produce, so it is passed on as it is, with the body reader's count
of what remains lowered by its length. Everything else (headers, a body's last piece, chunked
bodies, bodies read to the end of the connection, a piece that follows a partial one) goes
through mitmproxy's own code.

mitmproxy and h11 are pinned (deploy/egress/requirements.txt); `applies()` checks that the parts
this relies on are still what they were, and the proxy runs without this when they are not.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from h11._readers import ContentLengthReader
from mitmproxy.proxy import events
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp

__all__ = ["applies", "pass_body_pieces"]


def applies() -> bool:
    """Whether this mitmproxy's HTTP/1 connection and h11's reader are the ones read here."""
    connection = _http1.Http1Connection
    return (
        callable(getattr(connection, "_handle_event", None))
        and callable(getattr(connection, "read_body", None))
        and "_remaining" in ContentLengthReader(1).__dict__
    )


def pass_body_pieces() -> bool:
    """Installs the fast path (once); False when this mitmproxy is not the one it knows."""
    connection = _http1.Http1Connection
    handle = connection._handle_event
    if getattr(handle, "deckhands_pieces", False):
        return True
    if not applies():
        return False

    def handle_event(self: Any, event: events.Event) -> Generator[Any, Any, None]:
        if isinstance(event, events.DataReceived) and not self.buf:
            reader = getattr(self, "body_reader", None)
            data = event.data
            if (
                self.state == self.read_body
                and type(reader) is ContentLengthReader
                and 0 < len(data) < reader._remaining
            ):
                reader._remaining -= len(data)
                yield ReceiveHttp(self.ReceiveData(self.stream_id, data))
                return
        yield from handle(self, event)

    handle_event.deckhands_pieces = True  # type: ignore[attr-defined]
    connection._handle_event = handle_event
    return True
