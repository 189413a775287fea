"""Configuration of an env server: the environment, its address, worker pool, timeouts, limits.

Guarantee: an `EnvServerConfig` that validates describes a server that can start: pool sizes are
positive, and a non-loopback address comes with CURVE keys or an explicit `insecure = true`.
`PoolConfig` and `EnvTimeoutConfig` are shared with the orchestrator's env configs.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Discriminator, Field, Tag, model_validator

from envrl.config import BaseConfig
from envrl.log import LogLevel


class StaticPoolConfig(BaseConfig):
    """A fixed number of worker processes, started before the server reports ready."""

    type: Literal["static"] = "static"
    num_workers: int = Field(1, ge=1)
    """Worker processes, each running up to `multiplex` rollouts at once on its event loop."""
    multiplex: int = Field(256, ge=1)
    """Rollouts one worker runs concurrently (they mostly wait on the model server)."""

    @property
    def max_workers(self) -> int:
        return self.num_workers

    @property
    def min_workers(self) -> int:
        return self.num_workers


class ElasticPoolConfig(BaseConfig):
    """Between `min_workers` and `max_workers` processes: grows under load, retires idle workers."""

    type: Literal["elastic"] = "elastic"
    min_workers: int = Field(1, ge=1)
    """Workers kept even when idle (started before the server reports ready)."""
    max_workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    """Most worker processes; defaults to the number of CPUs."""
    multiplex: int = Field(256, ge=1)
    """Rollouts one worker runs concurrently (they mostly wait on the model server)."""
    idle_timeout: float = Field(60.0, gt=0)
    """Seconds a worker beyond `min_workers` may sit idle before it is retired."""
    grow_at: float = Field(0.75, gt=0, le=1)
    """Start another worker once in-flight rollouts exceed this fraction of the live capacity."""

    @model_validator(mode="after")
    def _min_below_max(self) -> ElasticPoolConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers})")
        return self


def _pool_type(value: Any) -> str | None:
    """The pool variant; a pool table without `type` is elastic, the default."""
    return value.get("type", "elastic") if isinstance(value, dict) else getattr(value, "type", None)


PoolConfig = Annotated[
    Annotated[StaticPoolConfig, Tag("static")] | Annotated[ElasticPoolConfig, Tag("elastic")], Discriminator(_pool_type)
]


class EnvTimeoutConfig(BaseConfig):
    """Deadlines that stop runaway environment work (seconds; none = no limit)."""

    rollout: float | None = Field(600.0, gt=0)
    """Whole rollout (or whole group) from the moment a worker starts it; then a `timeout` error Trace."""
    scoring: float | None = Field(60.0, gt=0)
    """Reward functions only (queueing and generation excluded); enforced by the environment."""
    kill_grace: float = Field(5.0, gt=0)
    """A worker that has not answered `kill_grace` s after a rollout's timeout (or its cancel) is
    presumed stuck (CPU-bound code ignores cancellation) and is killed and replaced."""


class EnvSpec(BaseConfig):
    id: str
    """Installed environment id (see `installed_environment_ids()`) or `package.module:function`."""
    args: dict[str, Any] = {}
    """Keyword arguments of the environment's `load_environment`."""


class CurveServerConfig(BaseConfig):
    """ZMQ CURVE authentication and encryption (files made by `zmq.auth.create_certificates`)."""

    secret_key_file: Path
    """The server's `.key_secret` certificate file."""
    client_keys_dir: Path
    """Directory of the `.key` (public) certificates of the clients allowed to connect."""


class EnvServerConfig(BaseConfig):
    env: EnvSpec
    address: str = "tcp://127.0.0.1:5000"
    """ZMQ address to bind; port 0 binds a free port, reported on stdout (and to a sidecar parent)."""
    pool: PoolConfig = ElasticPoolConfig()
    """Worker processes: {type = "static", num_workers, multiplex} or {type = "elastic", min_workers, max_workers, multiplex, ...}."""
    timeout: EnvTimeoutConfig = EnvTimeoutConfig()
    max_queued: int = Field(4096, ge=0)
    """Requests that may wait for a free worker slot; beyond, requests get an `at_capacity` error."""
    max_frame_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    """Largest request frame accepted; larger ones get a `too_large` error."""
    drain_timeout: float = Field(30.0, ge=0)
    """On SIGTERM, seconds to let in-flight rollouts finish before they are answered `shutting_down`."""
    curve: CurveServerConfig | None = None
    """CURVE keys; required to bind a non-loopback address unless `insecure`."""
    insecure: bool = False
    """Allow a non-loopback address without CURVE (anyone who can reach the port can run rollouts)."""
    log_file: Path | None = None
    """One log file for the server and its workers."""
    log_level: LogLevel = "INFO"
    """Lowest level logged by the server and its workers."""

    @model_validator(mode="after")
    def _exposed_needs_keys(self) -> EnvServerConfig:
        if not is_loopback(self.address) and self.curve is None and not self.insecure:
            raise ValueError(
                f"address {self.address} is reachable from other hosts; give CURVE keys "
                "(curve.secret_key_file, curve.client_keys_dir; see docs/protocol.md) or pass --insecure"
            )
        return self


def is_loopback(address: str) -> bool:
    """True for ipc://, inproc:// and tcp:// addresses on 127.0.0.0/8, ::1 or localhost."""
    parts = urlsplit(address)
    if parts.scheme in ("ipc", "inproc"):
        return True
    host = (parts.hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # '*', an interface name or a DNS name: assume it is exposed


class CurveClientConfig(BaseConfig):
    """A client's CURVE keys (files made by `zmq.auth.create_certificates`)."""

    server_public_key_file: Path
    """The server's public `.key` certificate file."""
    secret_key_file: Path
    """This client's `.key_secret` certificate file (its public key must be in the server's client_keys_dir)."""
