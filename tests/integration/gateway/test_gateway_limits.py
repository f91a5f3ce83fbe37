"""Bounded HTTP on the real gateway process (services.gateway.http.limits): no client can grow
its memory with a body or hold its connections with requests it never finishes.

The gateway here has short timeouts and a small cap on event streams, so it is a process of
its own, on the gateway tests' nats-server (and its storage double).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_doubles import StorageDouble, gateway_env

from services.gateway.settings import GatewaySettings
from tools.api_access import auth_headers
from tools.procs import free_port, wait_for_port

pytestmark = pytest.mark.timeout(120)

BODY_LIMIT = 1024 * 1024
REQUEST_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 1
STREAMS_PER_CLIENT = 3
CREATIONS = 2
FIFTY_MB = 50 * 1024 * 1024


class Gateway:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def memory_kib(self, field: str) -> int:
        """VmRSS (now) or VmHWM (the peak so far) of the gateway process."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.proc.pid}/status")


@pytest.fixture(scope="module")
def gateway(
    gateway_settings: GatewaySettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    port = free_port()
    settings = gateway_settings.model_copy(update={"port": port})
    env = {
        **gateway_env(settings),
        "DECKHANDS_MAX_REQUEST_BODY_BYTES": str(BODY_LIMIT),
        "DECKHANDS_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S),
        "DECKHANDS_KEEP_ALIVE_TIMEOUT_S": str(KEEP_ALIVE_S),
        "DECKHANDS_MAX_EVENT_STREAMS_PER_CLIENT": str(STREAMS_PER_CLIENT),
        "DECKHANDS_MAX_CREATIONS_IN_FLIGHT": str(CREATIONS),
        "DECKHANDS_CREATION_WAIT_S": "0.2",
    }
    log = tmp_path_factory.mktemp("gateway-limits") / "gateway.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.gateway"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for_port(port, timeout_s=30, proc=proc)
        deadline = time.monotonic() + 30
        while httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "gateway not ready"
            time.sleep(0.2)
        yield Gateway(proc, port)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        print(log.read_text()[-5000:])


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def _upload_until_answered(
    port: int, head: bytes, chunks: Iterator[bytes]
) -> tuple[int, dict[str, str], bytes, int]:
    """Send `head`, then body chunks while reading: (status, headers, body, bytes sent when
    the answer came)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0

    async def upload() -> None:
        nonlocal sent
        writer.write(head)
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)

    uploading = asyncio.create_task(upload())
    try:
        status, headers, body = await asyncio.wait_for(_read_response(reader), 10)
        sent_when_answered = sent
    finally:
        uploading.cancel()
        try:
            await uploading
        except (asyncio.CancelledError, ConnectionError):
            pass
        writer.close()
    return status, headers, body, sent_when_answered


def _plain_chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    for _ in range(total // size):
        yield b"x" * size


def _http_chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    """Transfer-Encoding: chunked framing, no length known in advance."""
    for _ in range(total // size):
        yield f"{size:x}\r\n".encode() + b"x" * size + b"\r\n"
    yield b"0\r\n\r\n"


async def test_fifty_mb_bodies_are_refused_at_once_and_memory_stays_flat(
    gateway: Gateway,
) -> None:
    peak_before = gateway.memory_kib("VmHWM")
    head = (
        f"POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {FIFTY_MB}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    # Eight at once: the case (612 MiB against a 512 Mi limit before).
    answers = await asyncio.gather(
        *(_upload_until_answered(gateway.port, head, _plain_chunks(FIFTY_MB)) for _ in range(8))
    )
    took = time.monotonic() - started
    # (How much each client had sent when it read the answer says nothing: the refused
    # connections' bytes are read and dropped for a moment, and eight uploads share this loop.)
    for status, headers, body, _ in answers:
        assert status == 413, body
        assert headers["connection"] == "close"
        detail = json.loads(body)["detail"]
        assert str(BODY_LIMIT) in detail and "DECKHANDS_MAX_REQUEST_BODY_BYTES" in detail
        assert str(FIFTY_MB) in detail
    assert took < 5, f"413 took {took:.1f}s"
    grown_kib = gateway.memory_kib("VmHWM") - peak_before
    assert grown_kib < 20 * 1024, f"the gateway's peak memory grew by {grown_kib} KiB"


async def test_a_chunked_body_is_refused_once_it_passes_the_limit(gateway: Gateway) -> None:
    peak_before = gateway.memory_kib("VmHWM")
    head = (
        b"POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    started = time.monotonic()
    status, _, body, _ = await _upload_until_answered(gateway.port, head, _http_chunks(FIFTY_MB))
    assert status == 413, body
    assert str(BODY_LIMIT) in json.loads(body)["detail"]
    assert time.monotonic() - started < 5
    assert gateway.memory_kib("VmHWM") - peak_before < 20 * 1024


async def test_a_body_within_the_limit_still_works(
    gateway: Gateway, storage: StorageDouble, api_key: str
) -> None:
    async with httpx.AsyncClient(
        base_url=gateway.url, headers=auth_headers(api_key), timeout=10
    ) as http:
        # 100,000 characters escaped as \u00e9: 600 KB of JSON, 200 KB once the gateway sends it.
        body = json.dumps({"task": "\u00e9" * 100_000})
        assert BODY_LIMIT / 2 < len(body) < BODY_LIMIT
        created = await http.post(
            "/v1/tasks", content=body, headers={"content-type": "application/json"}
        )
        assert created.status_code == 202, created.text


async def test_headers_past_the_limit_are_answered_431(gateway: Gateway) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
    await writer.drain()
    status, _, body = await asyncio.wait_for(_read_response(reader), 10)
    writer.close()
    assert status == 431
    assert "DECKHANDS_MAX_REQUEST_HEADER_BYTES" in json.loads(body)["detail"]


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := await reader.read(65536):
        data += chunk
    return data


async def test_unfinished_requests_are_cut_after_the_timeout(gateway: Gateway) -> None:
    partial = [
        b"",  # connects and says nothing
        b"POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\n",  # headers never end
        b'POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{"task": ',
    ]
    connections = []
    for index in range(200):
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(partial[index % len(partial)])
        await writer.drain()
        connections.append((reader, writer))
    started = time.monotonic()
    answers = await asyncio.wait_for(
        asyncio.gather(*(_closed_by_server(reader) for reader, _ in connections)),
        REQUEST_TIMEOUT_S + 10,
    )
    took = time.monotonic() - started
    for _, writer in connections:
        writer.close()
    assert took < REQUEST_TIMEOUT_S + 3, f"cut after {took:.1f}s"
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"DECKHANDS_REQUEST_TIMEOUT_S" in answer
    # The gateway still serves everyone else.
    async with httpx.AsyncClient(base_url=gateway.url, timeout=5) as http:
        assert (await http.get("/healthz")).status_code == 200


async def test_an_idle_keep_alive_connection_is_closed(gateway: Gateway) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    await writer.drain()
    status, _, _ = await asyncio.wait_for(_read_response(reader), 10)
    assert status == 200
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), KEEP_ALIVE_S + 5) == b""
    writer.close()
    assert time.monotonic() - started < KEEP_ALIVE_S + 2


async def test_event_streams_per_client_are_capped(
    gateway: Gateway, storage: StorageDouble, api_key: str
) -> None:
    timeout = httpx.Timeout(10, read=30)
    async with httpx.AsyncClient(
        base_url=gateway.url, headers=auth_headers(api_key), timeout=timeout
    ) as http:
        created = await http.post("/v1/tasks", json={"task": "stream me"})
        task_id = created.json()["id"]
        path = f"/v1/tasks/{task_id}/events/stream"
        streams = []
        for _ in range(STREAMS_PER_CLIENT):
            response = await http.send(http.build_request("GET", path), stream=True)
            assert response.status_code == 200
            streams.append(response)
        refused = await http.get(path)
        assert refused.status_code == 429
        assert refused.headers["retry-after"]
        detail = refused.json()["detail"]
        assert "DECKHANDS_MAX_EVENT_STREAMS_PER_CLIENT" in detail and "127.0.0.1" in detail
        # A stream that ends gives its slot back.
        await streams.pop().aclose()
        deadline = time.monotonic() + 10
        while True:
            again = await http.send(http.build_request("GET", path), stream=True)
            if again.status_code == 200 or time.monotonic() > deadline:
                break
            await again.aclose()
            await asyncio.sleep(0.2)
        assert again.status_code == 200
        streams.append(again)
        for response in streams:
            await response.aclose()


async def test_creations_beyond_the_bound_are_refused_at_once_and_lose_nothing(
    gateway: Gateway, api_key: str, redis_url: str
) -> None:
    """While Redis holds every write (CLIENT PAUSE), two creations wait on it; the others are
    answered 503 with Retry-After within the creation wait, not after the pause."""
    from redis.asyncio import Redis

    redis = Redis.from_url(redis_url)
    async with httpx.AsyncClient(
        base_url=gateway.url, headers=auth_headers(api_key), timeout=30
    ) as http:
        await http.post("/v1/tasks", json={"task": "warm the gateway's clients"})

        async def create(i: int) -> tuple[int, float, httpx.Response]:
            started = time.monotonic()
            answer = await http.post("/v1/tasks", json={"task": f"paused {i}"})
            return answer.status_code, time.monotonic() - started, answer

        try:
            await redis.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
            answers = await asyncio.gather(*(create(i) for i in range(6)))
        finally:
            await redis.execute_command("CLIENT", "UNPAUSE")
            await redis.aclose()
    refused = [(took, a) for code, took, a in answers if code == 503]
    accepted = [a for code, _, a in answers if code == 202]
    assert len(refused) == 6 - CREATIONS and len(accepted) == CREATIONS, answers
    for took, answer in refused:
        assert took < 1.0 and answer.headers["retry-after"] == "1"
        assert "DECKHANDS_MAX_CREATIONS_IN_FLIGHT" in answer.json()["detail"]
    # Those accepted were created whole.
    async with httpx.AsyncClient(
        base_url=gateway.url, headers=auth_headers(api_key), timeout=30
    ) as http:
        for answer in accepted:
            view = await http.get(f"/v1/tasks/{answer.json()['id']}")
            assert view.status_code == 200
