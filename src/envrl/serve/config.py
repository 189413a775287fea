"""Configuration of an env server: the environment, its address, worker pool, timeouts, limits.

Guarantee: an `EnvServerConfig` that validates describes a server that can start: pool sizes are
positive, a non-loopback address comes with CURVE keys or an explicit `insecure = true`, and
requests can make a worker reach only the model servers, API keys and tokenizers `model_access` names.
`PoolConfig` and `EnvTimeoutConfig` are shared with the orchestrator's env configs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from envrl.config import BaseConfig
from envrl.model.client import ClientConfig, EvalClientConfig, TrainClientConfig
from envrl.runtime.net import is_loopback
from envrl.serve.zmqio import MAX_BATCH
from envrl.telemetry.log import LogConfig


class PoolConfig(BaseConfig):
    """Between `min_workers` and `max_workers` processes: grows under load, retires idle workers.
    A fixed pool is `min_workers = max_workers`: it starts that many and never grows or shrinks."""

    min_workers: int = Field(1, ge=1)
    """Workers kept even when idle (started before the server reports ready)."""
    max_workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    """Most worker processes; defaults to the number of CPUs."""
    multiplex: int = Field(256, ge=1)
    """Rollouts one worker runs concurrently (they mostly wait on the model server)."""
    idle_timeout_s: float = Field(60.0, gt=0)
    """Seconds a worker beyond `min_workers` may sit idle before it is retired."""
    grow_at: float = Field(0.75, gt=0, le=1)
    """Start another worker once in-flight rollouts exceed this fraction of the live capacity."""

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
    def _min_below_max(self) -> PoolConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers})")
        return self


class EnvTimeoutConfig(BaseConfig):
    """Deadlines that stop runaway environment work (seconds; none = no limit)."""

    rollout_s: float | None = Field(600.0, gt=0)
    """Whole rollout (or whole group) from the moment a worker starts it; then a `timeout` error Trace."""
    scoring_s: float | None = Field(60.0, gt=0)
    """Reward functions only (queueing and generation excluded); enforced by the environment."""
    kill_grace_s: float = Field(5.0, gt=0)
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


class ModelAccessConfig(BaseConfig):
    """What a request's `client` may make a worker reach or load. Whoever starts the server decides;
    a request only picks among these (anything else is a `bad_request` naming this option).

    The defaults allow no model server, no API key and no tokenizer: only `scripted` clients
    without a tokenizer. Servers spawned by `rl` and `eval` allow exactly their run's client.
    """

    base_urls: list[str] = []
    """Model server URLs a `train` or `eval` client may name as `base_url` (compared without a
    trailing '/'); a train client naming several replicas needs every one of them here."""
    api_key_envs: list[str] = []
    """Environment variables an `eval` client may name as `api_key_env`: the worker sends that
    variable's value as a bearer token to the client's `base_url`."""
    tokenizers: list[str] = []
    """Tokenizers a `train` client (its `tokenizer`, else its `model`) or a `scripted` client's
    `tokenizer` may load: a hub name or path given here, or a local path that resolves to one
    given here or lies inside a local directory given here. Existing local paths are stored
    absolute (resolved where the config is made), so a server started elsewhere allows the same."""

    @field_validator("tokenizers")
    @classmethod
    def _local_paths_absolute(cls, tokenizers: list[str]) -> list[str]:
        return [str(Path(entry).resolve()) if Path(entry).exists() else entry for entry in tokenizers]

    def problem(self, client: ClientConfig) -> str | None:
        """What `client` asks for that this server does not allow, naming the field and the option; None if all is allowed."""
        allowed = {url.rstrip("/") for url in self.base_urls}
        for base_url in _base_urls(client):
            if base_url.rstrip("/") not in allowed:
                return _refusal("base_url", base_url, "base_urls", self.base_urls)
        api_key_env = getattr(client, "api_key_env", None)
        if api_key_env is not None and api_key_env not in self.api_key_envs:
            return _refusal("api_key_env", api_key_env, "api_key_envs", self.api_key_envs)
        tokenizer = getattr(client, "tokenizer", None)
        field = "tokenizer"
        if tokenizer is None and isinstance(client, TrainClientConfig):
            tokenizer, field = client.model, "model"  # a train client loads its model's tokenizer
        if tokenizer is not None and not self._tokenizer_allowed(tokenizer):
            return _refusal(field, tokenizer, "tokenizers", self.tokenizers)
        return None

    def _tokenizer_allowed(self, tokenizer: str) -> bool:
        if tokenizer in self.tokenizers:
            return True
        path = Path(tokenizer)
        try:
            if not path.exists():
                return False
            resolved = path.resolve()
        except (OSError, ValueError):  # a name too long for a path, a NUL byte: no such tokenizer
            return False
        return any(resolved.is_relative_to(entry) for entry in self.tokenizers if Path(entry).is_absolute())

    @classmethod
    def for_client(cls, client: ClientConfig) -> ModelAccessConfig:
        """Allow exactly what `client` uses: for the servers a run spawns for its own client."""
        tokenizer = getattr(client, "tokenizer", None) or (
            client.model if isinstance(client, TrainClientConfig) else None
        )
        return cls(
            base_urls=_base_urls(client),
            api_key_envs=[name for name in [getattr(client, "api_key_env", None)] if name is not None],
            tokenizers=[tokenizer] if tokenizer is not None else [],
        )


def _base_urls(client: ClientConfig) -> list[str]:
    """The model server URLs `client` calls (a train client may name several replicas)."""
    if isinstance(client, TrainClientConfig):
        return client.base_urls
    return [client.base_url] if isinstance(client, EvalClientConfig) else []


def _refusal(field: str, value: str, option: str, allowed: list[str]) -> str:
    return (
        f"params.client.{field} {_shown(value)} is not allowed by this server (model_access.{option} = {allowed}); "
        f"the server's owner can allow it with --model-access.{option.replace('_', '-')}"
    )


def _shown(value: str, limit: int = 200) -> str:
    """`value` quoted for an error message, cut to `limit` characters (a request may send megabytes)."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"


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
    KB (`bind`'s client config, `run`'s sampling); the bound also bounds what decoding a hostile
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
    model_access: ModelAccessConfig = ModelAccessConfig()
    """Model servers, API key variables and tokenizers requests may use (default: none; see docs/protocol.md)."""
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
