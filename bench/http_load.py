"""A lean HTTP/1.1 client for the benchmark's bursts of POSTs: one keep-alive connection per
simulated client, requests written whole and answers read by their Content-Length.

Why not httpx: the accept row's 50 clients stand for 50 machines, but here they share the 2
cores with the system they measure. httpx spent about 7 ms of CPU on each POST (3.7 CPU-s for
500, more than the gateway's own 2.8), so its own work, and the CPU it took from the gateway,
was a large part of every latency it reported. This client spends a small fraction of that;
what it reports is the server's time.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Answer", "LeanClient"]


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class LeanClient:
    """POSTs JSON over one connection, one request at a time (as a client with a pool of one
    does). One attempt each: a connection lost raises (the accept row counts answers)."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float = 60.0) -> None:
        split = urlsplit(base_url)
        self.host = split.hostname or "127.0.0.1"
        self.port = split.port or 80
        fixed = {"Host": f"{self.host}:{self.port}", "Content-Type": "application/json"}
        self.head = "".join(f"{k}: {v}\r\n" for k, v in (fixed | headers).items())
        self.timeout_s = timeout_s
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: dict[str, Any]) -> Answer:
        payload = json.dumps(body).encode()
        request = (
            f"POST {path} HTTP/1.1\r\n{self.head}Content-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        try:
            return await asyncio.wait_for(self._exchange(request), self.timeout_s)
        except BaseException:
            await self.aclose()  # a half-read answer leaves the connection unusable
            raise

    async def _exchange(self, request: bytes) -> Answer:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._streams
        writer.write(request)
        await writer.drain()
        status_line = await reader.readuntil(b"\r\n")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.aclose()
        return Answer(status, headers, body)

    async def aclose(self) -> None:
        if self._streams is not None:
            _, writer = self._streams
            self._streams = None
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass
