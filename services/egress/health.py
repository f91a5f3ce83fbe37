"""/healthz, /readyz and /metrics of the egress proxy, on their own port (never a sandbox's)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["serve_health"]


async def serve_health(host: str, port: int, ready: Callable[[], bool]) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            path = line.split(b" ")[1] if line.count(b" ") >= 2 else b""
            if path == b"/metrics":
                status, body, kind = b"200 OK", generate_latest(), CONTENT_TYPE_LATEST.encode()
            elif path in (b"/healthz", b"/readyz"):
                ok = path == b"/healthz" or ready()
                status = b"200 OK" if ok else b"503 Service Unavailable"
                body, kind = (b"ok\n" if ok else b"starting\n"), b"text/plain"
            else:
                status, body, kind = b"404 Not Found", b"not found\n", b"text/plain"
            writer.write(
                b"HTTP/1.1 "
                + status
                + b"\r\nContent-Type: "
                + kind
                + b"\r\nConnection: close\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            await writer.drain()
        except (OSError, TimeoutError, IndexError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, host, port)
