"""The run's secrets (`/update_weights` token, vLLM API key): a plan only names them; `make_secrets` takes the
launcher's value or a fresh random one, which travels only in the environment of the processes that name it."""

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
