"""The inference server's API key on every route but a few: vLLM checks it only under `/v1`,
`/v2`, `/inference` and `/cohere`, and serves generation elsewhere too (`/invocations`, SageMaker's
alias of the completion and chat routes; `/generative_scoring`).

Guarantee: with a key (`ENVRL_INFERENCE_API_KEY`, which `vllm_args` also hands to vLLM), every
HTTP and websocket request is answered 401 unless it carries `Authorization: Bearer <key>` or
its path is one of `OPEN`: liveness and version probes, the served weights' path, and
`/update_weights`, which checks its own token (reload.py). New routes a vLLM upgrade adds are
guarded by default. Without a key, nothing changes (vLLM serves every route to anyone).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from envrl.runtime.secrets import api_key

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

OPEN = frozenset({"/health", "/ping", "/load", "/version", "/metrics", "/weights", "/update_weights"})
"""Paths served without the key: probes that generate nothing (vLLM leaves them open as well),
`GET /weights` (the served policy's path and step) and `/update_weights` (its own token)."""


class KeyGuard:
    """ASGI middleware refusing requests without the key (see the module)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self._digest = hashlib.sha256(f"Bearer {key}".encode()).digest()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and scope.get("method") != "OPTIONS" and not self._allowed(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            body = (
                b'{"error":"Unauthorized: this server needs \'Authorization: Bearer <key>\' (ENVRL_INFERENCE_API_KEY)"}'
            )
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN:
            return True
        given = next((v for k, v in scope.get("headers", []) if k.lower() == b"authorization"), b"")
        return hmac.compare_digest(hashlib.sha256(given).digest(), self._digest)


def guard(app: Any) -> None:
    """Put `KeyGuard` in front of `app` (vLLM's FastAPI app, before it starts) when a key is set."""
    if (key := api_key()) is not None:
        app.add_middleware(KeyGuard, key=key)
