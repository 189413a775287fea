"""The one HTTP call helper: JSON POST/GET with a deadline and retries, over httpx or, for the
hot generation path, over `KeepAlivePool`.

Guarantee: every call ends within `attempts * (timeout + max backoff)` seconds, either with the
decoded JSON body of a 2xx response or with `HttpCallError` naming the URL, the attempts made and
the last failure. Connection errors, timeouts and 5xx responses are retried with exponential
backoff; 4xx responses are the caller's mistake and are raised at once with the server's message.
A `KeepAlivePool` connection goes back to the pool only after a complete response on it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import httpx
from loguru import logger
from pydantic import BaseModel


class RetryPolicy(BaseModel):
    max_retries: int = 3
    """Retries after the first attempt, for connection errors, timeouts and 5xx responses."""
    backoff: float = 0.5
    """Seconds before the first retry; doubles each retry."""
    max_backoff: float = 8.0
    timeout: float = 120.0
    """Deadline of one attempt, in seconds."""


IDLE_EXPIRY_S = 4.0
"""A `KeepAlivePool` connection idle this long is closed instead of reused: below the 5 s after
which vLLM's uvicorn closes idle connections itself (`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`), so a reuse
does not race the server's close."""


class KeepAlivePool:
    """Plain HTTP/1.1 JSON calls to one origin over kept-alive connections, O(1) per call.

    Why not httpx's pool: it scans every pooled connection (a readability syscall per idle one)
    each time a request enters or leaves, and its idle-connection count is itself a scan, so a
    pool holding the ~64 connections of one step's rollouts spends O(connections^2) per request
    (py-spy: 63% of the client's CPU in `_assign_requests_to_connections`); httpx's default limit
    of 20 kept-alive connections hides that by closing the rest, and reconnects instead.
    """

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"KeepAlivePool needs an http(s)://host[:port] URL, got {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = url.scheme == "https"
        self._host_header = url.netloc.encode()
        self._idle: deque[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = deque()

    async def request(self, method: str, path: str, payload: Any, timeout: float) -> tuple[int, bytes]:
        """(status, body) of `method path` with `payload` as JSON (None: no body), within `timeout` s."""
        body = b"" if payload is None else json.dumps(payload).encode()
        head = f"{method} {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n"
        request = b"".join(
            (head.encode(), b"Host: ", self._host_header, b"\r\nContent-Type: application/json\r\n\r\n", body)
        )
        async with asyncio.timeout(timeout):
            while True:
                reader, writer, reused = await self._connection()
                try:
                    writer.write(request)
                    status, data, keep = await _read_response(reader)
                except (ConnectionError, asyncio.IncompleteReadError) as e:
                    writer.close()
                    if reused and not getattr(e, "partial", b""):  # the server closed it while idle: again, fresh
                        continue
                    raise
                except BaseException:  # a timeout or a cancellation mid-response: the connection is unusable
                    writer.close()
                    raise
                if keep:
                    self._idle.append((reader, writer, time.monotonic()))
                else:
                    writer.close()
                return status, data

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """The most recently used live idle connection (reused = True), else a new one."""
        while self._idle:
            reader, writer, since = self._idle.pop()
            if time.monotonic() - since < IDLE_EXPIRY_S and not reader.at_eof():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls or None)
        return reader, writer, False

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, connection reusable) of one HTTP/1.1 response."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("the server closed the connection before answering")
    status = int(status_line.split(b" ", 2)[1])
    headers: dict[bytes, bytes] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    keep = headers.get(b"connection", b"").lower() != b"close"
    if b"content-length" in headers:
        return status, await reader.readexactly(int(headers[b"content-length"])), keep
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        chunks = []
        while size := int((await reader.readline()).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size))
            await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return status, b"".join(chunks), keep
    return status, await reader.read(), False


class HttpCallError(RuntimeError):
    """A call that failed for good; `status` is the HTTP status if a response came back."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


async def request_json(
    client: httpx.AsyncClient | KeepAlivePool,
    method: str,
    url: str,
    payload: dict[str, Any] | None = None,
    policy: RetryPolicy | None = None,
) -> Any:
    """`method` `url` with a JSON body; return the decoded JSON response, retrying per `policy`.
    With a `KeepAlivePool`, `url` must be on the pool's origin."""
    policy = policy or RetryPolicy()
    delay = policy.backoff
    last_failure = ""
    for attempt in range(policy.max_retries + 1):
        if attempt:
            logger.debug(f"{method} {url}: retry {attempt}/{policy.max_retries} in {delay:.1f}s after {last_failure}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, policy.max_backoff)
        try:
            if isinstance(client, KeepAlivePool):
                status, body = await client.request(method, urlsplit(url).path, payload, policy.timeout)
            else:
                response = await client.request(method, url, json=payload, timeout=policy.timeout)
                status, body = response.status_code, response.content
        except (httpx.TransportError, httpx.TimeoutException, OSError, asyncio.IncompleteReadError, TimeoutError) as e:
            last_failure = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            continue
        if status >= 500:
            last_failure = f"HTTP {status}: {body[:500].decode(errors='replace')}"
            continue
        if status >= 400:
            raise HttpCallError(
                f"{method} {url} was refused: HTTP {status}: {body[:2000].decode(errors='replace')}", status
            )
        return json.loads(body)
    raise HttpCallError(f"{method} {url} failed after {policy.max_retries + 1} attempts; last: {last_failure}")
