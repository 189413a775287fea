"""The one HTTP call helper: every call ends within `attempts * (timeout + max backoff)` with a 2xx JSON body or an
`HttpCallError` naming URL, attempts and last failure; no body past `max_bytes` is held; 4xx is never retried."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
import httpx
from loguru import logger
from pydantic import BaseModel, ConfigDict

from envrl.runtime.listeners import check_listener


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_retries: int = 3
    """Retries after the first attempt, for connection errors, timeouts and 5xx responses."""
    backoff_s: float = 0.5
    """Seconds before the first retry; doubles each retry."""
    max_backoff_s: float = 8.0
    """Longest wait between retries, in seconds."""
    timeout_s: float = 120.0
    """Deadline of one attempt, in seconds."""


MAX_RESPONSE_BYTES = 64 * 2**20
"""The largest response body read: a generation of 32k tokens with logprobs, or the prompt
logprobs of a 32k-token sample, is a few MB of JSON."""

IDLE_EXPIRY_S = 4.0
"""A kept-alive generation connection idle this long is closed instead of reused: below the 5 s
after which vLLM's uvicorn closes idle connections itself (`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`), so a
reuse does not race the server's close."""


def own_server_client(headers: Mapping[str, str] | None = None, **options: Any) -> httpx.AsyncClient:
    """An httpx client for the run's own servers: never through a proxy (`trust_env=False`: the
    proxy variables `rl` passes on would send keys in plain text to a site proxy), and every
    request first checks that no other local user listens where it goes (`ForeignListener`)."""

    async def check(request: httpx.Request) -> None:
        check_listener(str(request.url))

    return httpx.AsyncClient(headers=headers, trust_env=False, event_hooks={"request": [check]}, **options)


def keep_alive_session(headers: Mapping[str, str] | None = None) -> aiohttp.ClientSession:
    """An aiohttp session for the hot generation path: every connection kept alive, none capped.

    Why not httpx here: httpcore's pool scans every pooled connection (a readability syscall per
    idle one) each time a request enters or leaves, and its idle count is itself a scan, so a pool
    holding the connections of one step's rollouts spends O(connections^2) per request (profile in
    docs/measurements.md); httpx's default cap on kept-alive connections hides that by
    reconnecting the rest. aiohttp's connector reuses an
    idle connection in O(1). Never through a proxy; each new connection first checks that no
    other local user listens where it goes (`ForeignListener`). Create it inside the event loop that uses it.
    """
    checks = aiohttp.TraceConfig()  # each new connection (a first request, a reconnect) checks the listener
    checks.on_request_start.append(_note_url)
    checks.on_connection_create_start.append(_check_noted)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=IDLE_EXPIRY_S),
        headers=headers,
        trust_env=False,
        trace_configs=[checks],
    )


async def _note_url(session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestStartParams) -> None:
    context.url = str(params.url)


async def _check_noted(session: aiohttp.ClientSession, context: Any, params: object) -> None:
    check_listener(context.url)


def poll_delays(first_s: float = 0.05, max_s: float = 0.5) -> Iterator[float]:
    """The waits between readiness polls (`GET /health`): `first_s`, doubling up to `max_s`, so a
    server that comes up is seen within `max_s` (sooner in its first second), and one that takes
    a minute costs a poll every `max_s`."""
    delay = first_s
    while True:
        yield delay
        delay = min(delay * 2, max_s)


class HttpCallError(RuntimeError):
    """A call that failed for good; `status` is the HTTP status if a response came back."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def error_type(self) -> str | None:
        """The Trace's `Error.type` when it ends a rollout: `model_unavailable` when the server never
        answered or kept failing (no status, 5xx: an infrastructure failure), None (the class name)
        when it refused the call (4xx)."""
        return "model_unavailable" if self.status is None or self.status >= 500 else None


class ResponseTooLarge(HttpCallError):
    """The server sent more than the caller's byte bound."""


async def fetch(
    client: httpx.AsyncClient | aiohttp.ClientSession,
    method: str,
    url: str,
    payload: dict[str, Any] | None,
    timeout_s: float,
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> tuple[int, bytes]:
    """One attempt: (status, body), the body streamed and cut off past `max_bytes`
    (`ResponseTooLarge`). Transport errors and timeouts propagate as the library raises them."""
    if isinstance(client, aiohttp.ClientSession):
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with client.request(method, url, json=payload, timeout=timeout) as answer:
            return answer.status, await _bounded(answer.content.iter_chunked(2**16), method, url, max_bytes)
    async with client.stream(method, url, json=payload, timeout=timeout_s) as response:
        return response.status_code, await _bounded(response.aiter_bytes(), method, url, max_bytes)


async def _bounded(chunks: AsyncIterator[bytes], method: str, url: str, max_bytes: int) -> bytes:
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > max_bytes:
            raise ResponseTooLarge(
                f"{method} {url}: the response is larger than {max_bytes} bytes; refused (a model server's "
                "answers are a few MB; check that the URL points at one)"
            )
    return bytes(body)


async def request_json(
    client: httpx.AsyncClient | aiohttp.ClientSession,
    method: str,
    url: str,
    payload: dict[str, Any] | None = None,
    policy: RetryPolicy | None = None,
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> Any:
    """`method` `url` with a JSON body; return the decoded JSON response, retrying per `policy`."""
    policy = policy or RetryPolicy()
    delay = policy.backoff_s
    last_failure = ""
    for attempt in range(policy.max_retries + 1):
        if attempt:
            logger.debug(f"{method} {url}: retry {attempt}/{policy.max_retries} in {delay:.1f}s after {last_failure}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, policy.max_backoff_s)
        try:
            status, body = await fetch(client, method, url, payload, policy.timeout_s, max_bytes)
        except (httpx.TransportError, httpx.TimeoutException, aiohttp.ClientError, OSError, TimeoutError) as e:
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


def bearer(secret: str, source: str) -> dict[str, str]:
    """The `Authorization` header carrying `secret` (from `source`, e.g. "environment variable
    OPENAI_API_KEY"). Surrounding whitespace (a newline from `echo` or a file) is dropped; a space
    or control character inside is an error that names the source and position, never the secret,
    since an HTTP library's error about the header would quote it into traces and logs."""
    secret = secret.strip()
    bad = next((i for i, c in enumerate(secret) if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        raise ValueError(
            f"the secret in {source} holds a space or control character at position {bad} "
            f"(of {len(secret)}); fix the value (it is not shown here)"
        )
    return {"Authorization": f"Bearer {secret}"}
