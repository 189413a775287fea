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
