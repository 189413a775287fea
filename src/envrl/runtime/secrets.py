"""The names of the environment variables that carry envrl's secrets: secrets travel only in the environment of the
processes that need them, never in a config file or on a command line."""

from __future__ import annotations

import os

RELOAD_TOKEN_ENV = "ENVRL_RELOAD_TOKEN"
"""Default environment variable holding the `/update_weights` token."""
API_KEY_ENV = "ENVRL_INFERENCE_API_KEY"
"""Environment variable holding the key vLLM demands on its generation routes (vLLM's `--api-key`,
handed over as `VLLM_API_KEY`) and every envrl client sends, when set."""


def api_key() -> str | None:
    """The inference API key of this process's environment, if any."""
    return os.environ.get(API_KEY_ENV) or None
