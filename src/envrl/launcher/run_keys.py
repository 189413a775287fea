"""The secrets of a run: its `/update_weights` token and its vLLM API key (its CURVE keys:
`envclient/curve.py`, shared with the orchestrator's and `rl eval`'s sidecars).

Guarantee: a plan only names them (`Secret`); the launcher makes them when it executes the plan.
`make_secrets` gives each `Secret` the value the launcher's environment has, else a fresh random
one, and that value travels only in the environment of the processes that name it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence

from pydantic import BaseModel


class Secret(BaseModel):
    """A secret of the run, handed to the processes that name it in an environment variable."""

    name: str
    """The variable that carries it."""
    what: str
    """Who uses it, for `--dry-run` and the batch script."""


def make_secrets(wanted: Sequence[Secret], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Each wanted secret's value: the one `environ` already has, else a fresh random one."""
    return {secret.name: environ.get(secret.name) or secrets.token_urlsafe(32) for secret in wanted}
