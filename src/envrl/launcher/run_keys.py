"""The secrets of a run: its CURVE keys, its `/update_weights` token and its vLLM API key.

Guarantee: a plan only names them (`curve_keys`, `Secret`); the launcher makes them when it
executes the plan. `make_secrets` gives each `Secret` the value the launcher's environment has,
else a fresh random one, and that value travels only in the environment of the processes that
name it. `make_curve_keys` leaves a server key pair and one client key pair (the orchestrator's)
in a directory only their owner can enter, secrets mode 0600, made once and kept across a
resume; `curve_keys` names those files as the server's and the client's CURVE configs. Every env
server `rl` starts accepts only that client, on loopback too: another local user reaches the
port but not a rollout.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

import zmq.auth
from pydantic import BaseModel

from envrl.serve.config import CurveClientConfig, CurveServerConfig


def curve_keys(curve_dir: Path) -> tuple[CurveServerConfig, CurveClientConfig]:
    """The env servers' and the orchestrator's CURVE key files in `curve_dir` (`make_curve_keys`)."""
    server = CurveServerConfig(secret_key_file=curve_dir / "server.key_secret", client_keys_dir=curve_dir / "clients")
    client = CurveClientConfig(
        server_public_key_file=curve_dir / "server.key",
        secret_key_file=curve_dir / "clients" / "orchestrator.key_secret",
    )
    return server, client


def make_curve_keys(curve_dir: Path) -> None:
    """Create the key files `curve_keys` names, secrets readable by their owner only (kept if there)."""
    server, client = curve_keys(curve_dir)
    if server.secret_key_file.is_file() and client.secret_key_file.is_file():
        return
    # Owner-only directories first: zmq writes each secret before the chmod below can narrow it.
    curve_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (curve_dir / "clients").mkdir(exist_ok=True, mode=0o700)
    zmq.auth.create_certificates(curve_dir, "server")
    zmq.auth.create_certificates(curve_dir / "clients", "orchestrator")
    for secret in (server.secret_key_file, client.secret_key_file):
        os.chmod(secret, 0o600)


class Secret(BaseModel):
    """A secret of the run, handed to the processes that name it in an environment variable."""

    name: str
    """The variable that carries it."""
    what: str
    """Who uses it, for `--dry-run` and the batch script."""


def make_secrets(wanted: Sequence[Secret], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Each wanted secret's value: the one `environ` already has, else a fresh random one."""
    return {secret.name: environ.get(secret.name) or secrets.token_urlsafe(32) for secret in wanted}
