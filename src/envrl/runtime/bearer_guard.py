"""`BearerGuard`: a request or WebSocket handshake reaches the app only with `Authorization: Bearer <token>`
(compared in constant time) or an open path or method; anything else is answered 401 or closed before the app sees
it."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class BearerGuard:
    """ASGI middleware refusing requests without the token (see the module)."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        *,
        refusal: bytes,
        content_type: bytes = b"text/plain",
        open_paths: frozenset[str] = frozenset(),
        open_methods: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self._digest = hashlib.sha256(f"Bearer {token}".encode()).digest()
        self._refusal = refusal
        self._content_type = content_type
        self._open_paths = open_paths
        self._open_methods = open_methods

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and not self._allowed(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            headers = [(b"content-type", self._content_type), (b"content-length", str(len(self._refusal)).encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": self._refusal})
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        if scope.get("method") in self._open_methods:
            return True
        if scope["path"].removeprefix(scope.get("root_path", "")) in self._open_paths:
            return True
        given = next((v for k, v in scope.get("headers", []) if k.lower() == b"authorization"), b"")
        return hmac.compare_digest(hashlib.sha256(given).digest(), self._digest)
