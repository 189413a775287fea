"""With an API key, every HTTP and websocket request to the inference server is answered 401 unless it carries the
key or its path is one of `OPEN`; routes a vLLM upgrade adds are guarded by default."""

from __future__ import annotations

from typing import Any

from envrl.runtime.bearer_guard import BearerGuard
from envrl.runtime.secrets import api_key

OPEN = frozenset({"/health", "/ping", "/load", "/version", "/metrics", "/weights", "/update_weights"})
"""Paths served without the key: probes that generate nothing (vLLM leaves them open as well),
`GET /weights` (the served policy's path and step) and `/update_weights` (its own token)."""
REFUSAL = b'{"error":"Unauthorized: this server needs \'Authorization: Bearer <key>\' (ENVRL_INFERENCE_API_KEY)"}'


def guard(app: Any) -> None:
    """Put `BearerGuard` in front of `app` (vLLM's FastAPI app, before it starts) when a key is set;
    CORS preflights (OPTIONS) pass, as vLLM's own key check lets them."""
    if (key := api_key()) is not None:
        app.add_middleware(
            BearerGuard,
            token=key,
            refusal=REFUSAL,
            content_type=b"application/json",
            open_paths=OPEN,
            open_methods=frozenset({"OPTIONS"}),
        )
