"""Config of an env server: a valid `EnvServerConfig` can start (positive pool sizes, a non-loopback address with
CURVE keys or `insecure = true`), and its workers reach only its one model client; no request names a client."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from envrl.config import BaseConfig
from envrl.model.client import ClientConfig
from envrl.runtime.net import is_loopback
from envrl.serve.zmqio import MAX_BATCH
from envrl.telemetry.log import LogConfig


class PoolShape(BaseConfig):
    """Between `min_workers` and `max_workers` processes: grows under load, retires idle workers.
    A fixed pool is `min_workers = max_workers`: it starts that many and never grows or shrinks."""

    min_workers: int = Field(1, ge=1)
    """Workers kept even when idle (started before the server reports ready)."""
    max_workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    """Most worker processes; defaults to the number of CPUs."""
    multiplex: int = Field(256, ge=1)
    """Rollouts one worker runs concurrently (they mostly wait on the model server)."""

    @model_validator(mode="before")
    @classmethod
    def _no_pool_type(cls, data: Any) -> Any:
        """The two former pool shapes' keys, refused with the keys that say the same (the value given
        included, which a row of `config_migrations.MIGRATIONS` could not name)."""
        if not isinstance(data, dict) or not {"type", "num_workers"} & data.keys():
            return data
        keys = [f"{key} = {data[key]!r}" for key in ("type", "num_workers") if key in data]
        given = f"{' and '.join(keys)} {'were' if len(keys) > 1 else 'was'} removed (one pool shape)"
        if data.get("type", "static") == "static":
            workers = data.get("num_workers", 1)
            raise ValueError(f"{given}: set min_workers = max_workers = {workers}")
        raise ValueError(f"{given}: drop it; every pool grows from min_workers to max_workers")

    @model_validator(mode="after")
    def _min_below_max(self) -> PoolShape:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers})")
        return self


class PoolConfig(PoolShape):
    """An env server's pool: its shape (an env table's `pool`) and how it grows and shrinks."""

    idle_timeout_s: float = Field(60.0, gt=0)
    """Seconds a worker beyond `min_workers` may sit idle before it is retired."""
    grow_at: float = Field(0.75, gt=0, le=1)
    """Start another worker once in-flight rollouts exceed this fraction of the live capacity."""


KILL_GRACE_S = 5.0
"""Default of `EnvTimeoutConfig.kill_grace_s`, the one a server spawned for an env table gets."""


class RolloutTimeouts(BaseConfig):
    """Deadlines that stop runaway environment work (seconds; none = no limit)."""

    rollout_s: float | None = Field(600.0, gt=0)
    """Whole rollout (or whole group) from the moment a worker starts it; then a `timeout` error Trace."""
    scoring_s: float | None = Field(60.0, gt=0)
    """Reward functions only (queueing and generation excluded); enforced by the environment."""


class EnvTimeoutConfig(RolloutTimeouts):
    """An env server's deadlines: an env table's `timeout`, and when a stuck worker is killed."""

    kill_grace_s: float = Field(KILL_GRACE_S, gt=0)
    """A worker that has not answered `kill_grace_s` after a rollout's timeout (or its cancel) is
    presumed stuck (CPU-bound code ignores cancellation) and is killed and replaced."""


class EnvSpec(BaseConfig):
    id: str
    """Installed environment id (see `installed_environment_ids()`) or `package.module:function`."""
    args: dict[str, Any] = {}
    """Keyword arguments of the environment's `load_environment`."""


def load_secret_certificate(path: Path, key: str) -> tuple[bytes, bytes]:
    """(public, secret) keys of the CURVE certificate `path` (config key `key`); refuses a file other
    users could read, as ssh does, since whoever reads it can pose as its owner."""
    import zmq.auth  # pyzmq; imported here so the config module stays light

    mode = path.stat().st_mode if path.exists() else None
    if mode is not None and mode & 0o077:
        raise ValueError(
            f"{key} {path} is readable by other users (mode {mode & 0o777:o}): run `chmod 600 {path}` "
            "(make keys under `umask 077`, docs/protocol.md)"
        )
    public, secret = zmq.auth.load_certificate(path)
    if secret is None:
        raise ValueError(f"{key} {path} holds no secret key (use the .key_secret file)")
    return public, secret


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
    pool: PoolConfig = PoolConfig()
    """Worker processes: {min_workers, max_workers, multiplex, idle_timeout_s, grow_at}."""
    timeout: EnvTimeoutConfig = EnvTimeoutConfig()
    max_queued: int = Field(4096, ge=0)
    """Requests that may wait for a free worker slot; beyond, requests get an `at_capacity` error."""
    max_client_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """Bytes of request frames one client may have accepted and not yet answered; beyond, its
    requests get an `at_capacity` error (the server keeps each frame until its answer)."""
    max_pending_bytes: int = Field(512 * 1024 * 1024, ge=1024)
    """Bytes of request frames all clients together may have accepted and not yet answered;
    beyond, requests get an `at_capacity` error."""
    max_frame_bytes: int = Field(64 * 1024, ge=1024)
    """Largest request frame accepted; larger ones get a `too_large` error. A frame over twice this
    size is not even read: ZMQ drops the connection that sent it (its MAXMSGSIZE). Requests are
    KB (`run`'s sampling); the bound also bounds what decoding a hostile
    frame costs the broker, which every client waits on."""
    max_group_size: int = Field(1024, ge=1)
    """Largest `n` of a `run_group` request; larger ones get a `bad_request`."""
    max_reruns: int = Field(2, ge=0)
    """Times a rollout whose worker died (crash, OOM, SIGKILL) is re-run on another worker before it
    is answered with a `worker_died` error Trace."""
    client_send_queue: int = Field(10_000, ge=MAX_BATCH)
    """Answers that may wait for one client that is not reading: this many in ZMQ's queue (SNDHWM)
    and, once that is full, as many more held by the server. At least 4096, the requests the server
    reads in one turn, so that a client that sends a burst and reads is never dropped."""
    client_stall_timeout_s: float = Field(30.0, gt=0)
    """Seconds a client's answers may stay blocked (its queue full); then the server drops it:
    logs why, cancels its requests and discards their answers."""
    client: ClientConfig | None = None
    """The model client every rollout uses, e.g. `--client.type train --client.base-url
    http://127.0.0.1:8000 --client.model m` (docs/protocol.md); without one, `run` is a
    `bad_request`. `info` reports it without secrets."""
    drain_timeout_s: float = Field(30.0, ge=0)
    """On SIGTERM, seconds to let in-flight rollouts finish before they are answered `shutting_down`."""
    curve: CurveServerConfig | None = None
    """CURVE keys; required to bind a non-loopback address unless `insecure`."""
    insecure: bool = False
    """Allow a non-loopback address without CURVE (anyone who can reach the port can run rollouts)."""
    log: LogConfig = LogConfig()
    """The server's and its workers' log (`--log.file`, `--log.level`), as every envrl command's."""

    @model_validator(mode="after")
    def _exposed_needs_keys(self) -> EnvServerConfig:
        if not is_loopback(self.address) and self.curve is None and not self.insecure:
            raise ValueError(
                f"address {self.address} is reachable from other hosts; give CURVE keys "
                "(curve.secret_key_file, curve.client_keys_dir; see docs/protocol.md) or pass --insecure"
            )
        return self


class CurveClientConfig(BaseConfig):
    """A client's CURVE keys (files made by `zmq.auth.create_certificates`)."""

    server_public_key_file: Path
    """The server's public `.key` certificate file."""
    secret_key_file: Path
    """This client's `.key_secret` certificate file (its public key must be in the server's client_keys_dir)."""


def client_flags(client: ClientConfig) -> str:
    """The `env-server` options that make it serve `client` (its keys that differ from the defaults),
    quoted for a shell: what a refusal of a server with another client tells its owner to pass."""
    values = client.model_dump(mode="json", exclude_defaults=True)
    values.pop("type", None)
    if values.get("tokenizer") is not None and _same_path(values["tokenizer"], values.get("model")):
        del values["tokenizer"]  # the default: the model's own
    flags = [f"--client.type {client.type}"]

    def add(prefix: str, value: object) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                add(f"{prefix}.{key.replace('_', '-')}", inner)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flags.append(f"--client.{prefix} {shlex.quote(text)}")

    for key, value in values.items():
        add(key.replace("_", "-"), value)
    return " ".join(flags)


def _same_path(a: str, b: str | None) -> bool:
    """`a` and `b` name the same local directory, or are the same name."""
    return a == b or (b is not None and Path(a).exists() and Path(a).resolve() == Path(b).resolve())
