"""The one HTTP call helper: JSON POST/GET with a deadline and retries.

Guarantee: every call ends within `attempts * (timeout + max backoff)` seconds, either with the
decoded JSON body of a 2xx response or with `HttpCallError` naming the URL, the attempts made and
the last failure. Connection errors, timeouts and 5xx responses are retried with exponential
backoff; 4xx responses are the caller's mistake and are raised at once with the server's message.
"""

from __future__ import annotations

import asyncio
from typing import Any

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


class HttpCallError(RuntimeError):
    """A call that failed for good; `status` is the HTTP status if a response came back."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


async def request_json(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    payload: dict[str, Any] | None = None,
    policy: RetryPolicy | None = None,
) -> Any:
    """`method` `url` with a JSON body; return the decoded JSON response, retrying per `policy`."""
    policy = policy or RetryPolicy()
    delay = policy.backoff
    last_failure = ""
    for attempt in range(policy.max_retries + 1):
        if attempt:
            logger.debug(f"{method} {url}: retry {attempt}/{policy.max_retries} in {delay:.1f}s after {last_failure}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, policy.max_backoff)
        try:
            response = await client.request(method, url, json=payload, timeout=policy.timeout)
        except (httpx.TransportError, httpx.TimeoutException) as e:
            last_failure = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            continue
        if response.status_code >= 500:
            last_failure = f"HTTP {response.status_code}: {response.text[:500]}"
            continue
        if response.status_code >= 400:
            raise HttpCallError(
                f"{method} {url} was refused: HTTP {response.status_code}: {response.text[:2000]}", response.status_code
            )
        return response.json()
    raise HttpCallError(f"{method} {url} failed after {policy.max_retries + 1} attempts; last: {last_failure}")
