"""A streamed plain-HTTP response body written to the sandbox without mitmproxy's layers.

Each piece of a streamed body used to travel the whole layer stack: the host's HTTP/1 layer, the
HTTP layer's routing, the flow's stream, the sandbox's HTTP/1 layer and back up, a few dozen
generator steps for every read of up to 256 KiB, and the largest part of the proxy's CPU on a
download (bench/egress_bench.py, download row). When every one of those steps would pass the
piece on unchanged, this writes it to the sandbox's connection at once, with the host's body
reader's count lowered by its length, as body_pieces.py's fast path does. That is when:

- the piece comes from a plain-TCP host connection whose layer is mitmproxy's HTTP client
  speaking HTTP/1,
  nothing buffered, reading a Content-Length body the piece lies inside (not its last byte:
  the end of a response goes through mitmproxy, which then finishes the flow);
- the flow's stream sends the body on as it comes (`stream is True`: no function sees the
  pieces, as the redaction of echoed secrets does; not stored), paused by no hook;
- the sandbox's side is mitmproxy's HTTP/1 server, without TLS, answering this very response
  without chunked framing (the piece is then written as it is);
- no other event is being handled (mitmproxy's own lock).

Anything else goes through mitmproxy unchanged. The sandbox's writer is still the counted one
(handoff.py), so the tenant's bytes are counted and cut as before. mitmproxy and h11 are pinned
(deploy/egress/requirements.txt); `applies()` checks the parts this reads.
"""

from __future__ import annotations

import weakref
from typing import Any

from h11._readers import ContentLengthReader
from mitmproxy.connection import Connection
from mitmproxy.proxy import events, server
from mitmproxy.proxy.layer import Layer
from mitmproxy.proxy.layers.http import HttpClient, HttpLayer, HttpStream
from mitmproxy.proxy.layers.http._http1 import Http1Client, Http1Server

from .body_splice import splice_next_read
from .metrics import BODY_RELAYED

__all__ = ["applies", "relay_streamed_bodies"]

# Which HTTP layer holds each connection (host or sandbox side) it made a layer for.
_owners: weakref.WeakKeyDictionary[Connection, HttpLayer] = weakref.WeakKeyDictionary()


class _Connections(dict[Connection, Any]):
    """An HTTP layer's `connections`, noting the layer as the owner of each one added."""

    def __init__(self, owner: HttpLayer) -> None:
        super().__init__()
        self._owner = weakref.ref(owner)

    def __setitem__(self, conn: Connection, layer: Any) -> None:
        super().__setitem__(conn, layer)
        owner = self._owner()
        if owner is not None:
            _owners[conn] = owner


def applies() -> bool:
    """Whether this mitmproxy holds the parts read here."""
    layer_fields = getattr(Layer, "__annotations__", {})
    return (
        callable(getattr(server.ConnectionHandler, "server_event", None))
        and "child_layer" in getattr(HttpClient, "__annotations__", {})
        and "connections" in getattr(HttpLayer, "__annotations__", {})
        and "_paused" in layer_fields
        and "_paused_event_queue" in layer_fields
        and callable(getattr(HttpStream, "state_stream_response_body", None))
        and callable(getattr(Http1Client, "read_body", None))
        and "_remaining" in ContentLengthReader(1).__dict__
    )


def _destination(http: HttpLayer, conn: Connection, size: int) -> tuple[Any, Any] | None:
    """(the host's body reader, the sandbox's connection) when a piece of `size` bytes from
    `conn` would reach the sandbox unchanged; None otherwise."""
    outer = http.connections.get(conn)
    if type(outer) is not HttpClient or outer._paused is not None:
        return None
    client: Any = getattr(outer, "child_layer", None)  # HTTP/1, 2 or 3, once the host answered
    if type(client) is not Http1Client or client.buf or client.state != client.read_body:
        return None
    reader = client.body_reader
    if type(reader) is not ContentLengthReader or not 0 < size < reader._remaining:
        return None
    stream = http.streams.get(client.stream_id)
    if (
        stream is None
        or stream._paused is not None
        or stream._paused_event_queue
        or stream.server_state != stream.state_stream_response_body
    ):
        return None
    response = stream.flow.response
    if (
        response is None
        or response.stream is not True
        or stream.context.options.store_streamed_bodies
    ):
        return None
    sandbox = http.context.client
    answering: Any = http.connections.get(sandbox)
    if (
        sandbox.tls
        or sandbox.tls_established
        or type(answering) is not Http1Server
        or answering.stream_id != client.stream_id
        or answering.response is not response
        or "chunked" in response.headers.get("transfer-encoding", "").lower()
    ):
        return None
    return reader, sandbox


def relay_streamed_bodies() -> bool:
    """Installs the relay (once); False when this mitmproxy is not the one it knows."""
    handler = server.ConnectionHandler
    server_event = handler.server_event
    if getattr(server_event, "deckhands_relay", False):
        return True
    if not applies():
        return False
    init = HttpLayer.__init__

    def http_init(self: HttpLayer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.connections = _Connections(self)

    async def relayed(self: Any, event: events.Event) -> None:
        if type(event) is events.DataReceived and not self._server_event_lock.locked():
            conn = event.connection
            http = _owners.get(conn)
            found = _destination(http, conn, len(event.data)) if http is not None else None
            io = self.transports.get(found[1]) if found is not None else None
            if found is not None and io is not None and io.writer is not None:
                found[0]._remaining -= len(event.data)
                self.timeout_watchdog.register_activity()
                if not io.writer.is_closing():
                    io.writer.write(event.data)
                    BODY_RELAYED.inc(len(event.data))
                    still = found[0]._remaining
                    splice_next_read(self, conn, lambda: _destination(http, conn, 1), still)
                return
        await server_event(self, event)

    relayed.deckhands_relay = True  # type: ignore[attr-defined]
    HttpLayer.__init__ = http_init
    handler.server_event = relayed
    return True
