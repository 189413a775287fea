"""Config of one env (`EnvConfig`) and of how an eval scores it (`EvalScoringConfig`): a declaration builds its server
launch and sampling args in one place; an eval table holds only what scores its env (docs/config.md)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from envrl.config import BaseConfig, ConfigError
from envrl.model.client import ChatClientConfig, ClientConfig, EvalClientConfig, SamplingArgs, SamplingParams
from envrl.runtime.net import is_loopback
from envrl.runtime.restarts import RestartPolicy
from envrl.serve.config import (
    CurveClientConfig,
    CurveServerConfig,
    EnvServerConfig,
    EnvSpec,
    EnvTimeoutConfig,
    PoolConfig,
    PoolShape,
    RolloutTimeouts,
)
from envrl.serve.launch import EnvServerLaunch

VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What `pass_env` may name: a variable a shell (and `rl --slurm`'s job script) can expand."""


class EnvConfig(BaseConfig):
    """An environment and its env server: the keys a train env and an eval env share."""

    id: str
    """Installed environment id, or `package.module:function`."""
    name: str | None = None
    """Name in logs, metrics and batch files; defaults to `id`. Must be unique."""
    args: dict[str, Any] = {}
    """Keyword arguments of the environment's `load_environment`."""
    address: str | None = None
    """An env server already running there (external); without it a sidecar server is spawned."""
    python: Path | None = None
    """The interpreter a spawned server of this env runs in (e.g. `.venvs/wordle/bin/python`), so
    the env's dependencies never resolve with torch and vLLM; it needs the light `envrl` install
    (docs/adapters.md). Default: the interpreter running envrl."""
    project: Path | None = None
    """A uv project (e.g. `deps/envs/openenv-count`) whose `.venv/bin/python` runs a spawned server
    of this env; create it with `uv sync --project <project> --locked`. Exclusive with `python`."""
    curve: CurveClientConfig | None = None
    """CURVE keys for an external server (`server_public_key_file`, `secret_key_file`): the server
    authenticates this client and the traffic is encrypted (docs/protocol.md). Required off
    loopback; `rl` sets the run's own for the servers it starts."""
    insecure: bool = False
    """Connect to a non-loopback `address` without CURVE (plain TCP: anyone on the path reads and
    injects rollouts); only for networks you trust."""
    pool: PoolShape = PoolShape()
    """Worker pool of a spawned sidecar server (its growth and idle retirement: the server's defaults)."""
    max_retries: int = Field(2, ge=0)
    """Re-runs of a rollout that came back with an error before it counts as failed."""
    at_capacity_wait_s: ClassVar[float] = 300.0
    """Seconds one call keeps retrying a server that answers `at_capacity` (jittered exponential
    backoff, 20 ms doubling to 2 s; each retry counted in `counters/at_capacity_retries`), within
    the rollout's own deadline; then the rollout is an `at_capacity` error Trace."""
    reconnect_timeout_s: ClassVar[float] = 300.0
    """Seconds to wait for a lost env server (connection dropped, or silent) to answer again before
    the orchestrator fails; rollouts lost with it are re-run once it is back."""
    pass_env: list[str] = []
    """Variables of the launcher's environment a spawned server of this env (its workers, the
    programs they run) gets beyond the allow-list of locale, paths, caches and proxies
    (`envrl.runtime.process.ALLOWED_ENV`), e.g. `["OPENAI_API_KEY"]`; a model client's `api_key_env` is
    passed by itself. Tokens and keys not listed never reach model-driven code."""
    timeout: RolloutTimeouts = RolloutTimeouts()
    sampling: dict[str, Any] = {}
    """Overrides of the orchestrator's `sampling` keys for this env."""
    client: ChatClientConfig | None = None
    """A chat model this env's rollouts talk to instead of the run's own (a teacher behind an
    OpenAI API, say: `base_url`, `model`, `api_key_env`); default: the train client of the run's
    inference server. Its turns are token-less, which training back-fills with the student's chat
    template (their tokens count as on-policy: importance ratio 1)."""

    @field_validator("pass_env")
    @classmethod
    def _pass_env_names_variables(cls, names: list[str]) -> list[str]:
        bad = [name for name in names if not VARIABLE_NAME.fullmatch(name)]
        if bad:
            raise ValueError(
                f"{bad} are not environment variable names (letters, digits and _, not starting with a digit)"
            )
        return names

    @field_validator("client", mode="before")
    @classmethod
    def _client_has_no_type(cls, client: Any) -> Any:
        if isinstance(client, dict) and "type" in client:
            raise ValueError(
                f"type = {client['type']!r} was removed: an env's own client is a chat client (an OpenAI-compatible "
                "API: base_url, model, api_key_env, ...), so drop `type`; leave `client` out to use the run's own server"
            )
        return client

    @model_validator(mode="after")
    def _remote_needs_curve(self) -> EnvConfig:
        if self.address is not None and not is_loopback(self.address) and self.curve is None and not self.insecure:
            raise ValueError(
                f"env {self.resolved_name!r}: address {self.address} is not on loopback; give its CURVE keys "
                "(curve.server_public_key_file, curve.secret_key_file) or set insecure = true"
            )
        return self

    @model_validator(mode="after")
    def _one_interpreter(self) -> EnvConfig:
        if self.python is not None and self.project is not None:
            raise ValueError(f"env {self.resolved_name!r}: set `python` or `project`, not both")
        return self

    @property
    def resolved_name(self) -> str:
        return self.name or self.id

    @property
    def own_client(self) -> EvalClientConfig | None:
        """`client` as its env server serves it (a model client of kind `eval`); None: the run's own."""
        return None if self.client is None else EvalClientConfig.of(self.client)

    def interpreter(self) -> str:
        """The python a spawned server of this env runs in; a `ConfigError` saying how to create it if it is missing."""
        if self.python is None and self.project is None:
            return sys.executable
        path = self.python if self.python is not None else self.project / ".venv" / "bin" / "python"  # type: ignore[operator]
        if path.exists():
            return str(path.absolute())  # not resolved: a venv's python is a symlink to the base interpreter
        if self.project is not None:
            how = f"create it with `uv sync --project {self.project} --locked`"
            if not (self.project / "pyproject.toml").exists():
                how = f"{self.project} has no pyproject.toml: `project` must name a uv project directory"
            raise ConfigError(f"env {self.resolved_name!r}: project {self.project} has no interpreter at {path}; {how}")
        raise ConfigError(
            f"env {self.resolved_name!r}: python {path} does not exist; point `python` at a venv's bin/python "
            "that has envrl installed (e.g. `uv venv DIR && uv pip install -p DIR/bin/python -e .`)"
        )

    def server_launch(
        self,
        split: str,
        address: str,
        client: ClientConfig,
        restarts: RestartPolicy,
        curve: CurveServerConfig | None = None,
    ) -> EnvServerLaunch:
        """The server of this env on `address` (admitting only the clients of `curve`, if given), for
        whoever starts it (serve/launch.py) and restarts it per `restarts`, its rollouts on `client`
        (the server's config: no request names a client)."""
        return EnvServerLaunch(
            split=split,
            name=self.resolved_name,
            config=EnvServerConfig(
                env=EnvSpec(id=self.id, args=self.args),
                address=address,
                pool=PoolConfig.model_validate(self.pool.model_dump()),
                timeout=EnvTimeoutConfig.model_validate(self.timeout.model_dump()),
                client=client,
                curve=curve,
            ),
            python=self.interpreter(),
            restarts=restarts,
            pass_env=self.pass_env,
        )

    def sampling_args(self, base: SamplingParams) -> SamplingArgs:
        """This env's sampling: the run's, with this env's overrides (computed once)."""
        unknown = sorted(set(self.sampling) - set(SamplingParams.model_fields))
        if unknown:
            hint = " (every rollout's seed derives from the run's top-level `seed`)" if "seed" in unknown else ""
            raise ValueError(f"env {self.resolved_name!r}: unknown sampling keys {unknown}{hint}")
        return SamplingArgs.model_validate({**base.model_dump(), **self.sampling})


class DeclaredEnvConfig(EnvConfig):
    """An env of the run (`[[orchestrator.envs]]`): every env server of the run is declared here
    once; trained on unless `train = false`, evaluated when an `[[orchestrator.eval.env]]` names it."""

    train: bool = True
    """Sample train rollouts from it; `false`: an env only evaluated (an eval table names it)."""
    ratio: float | None = Field(None, gt=0)
    """Share of train rollouts (relative); set on every train env or on none (then: by task count)."""

    @model_validator(mode="after")
    def _ratio_is_for_training(self) -> DeclaredEnvConfig:
        if not self.train and self.ratio is not None:
            raise ValueError(
                f"env {self.resolved_name!r}: `ratio` is a share of training; remove it or drop `train = false`"
            )
        return self


class EvalScoringConfig(BaseConfig):
    """How an eval env is scored: the keys an eval table adds to its env."""

    num_examples: int = Field(16, ge=1)
    """Eval tasks per evaluation (the first `num_examples` eval tasks)."""
    rollouts_per_example: int = Field(1, ge=1)
    pass_threshold: float = 1.0
    """A rollout passes (for pass@k) when its reward is at least this."""
    pass_at: list[int] = []
    """More k for pass@k (unbiased estimator), e.g. [4, 8]; pass@1 and pass@r (r =
    rollouts_per_example) are always reported. Each k must be at most rollouts_per_example."""

    def scored_env(self) -> str:
        """The name of the env this scores, for errors."""
        return ""

    @model_validator(mode="after")
    def _pass_at_fits(self) -> EvalScoringConfig:
        check_pass_at(self, self.scored_env())
        return self


class EvalTableConfig(EvalScoringConfig):
    """`[[orchestrator.eval.env]]`: a declared env (`env`) and how it is scored; its server's keys
    are the declaration's (one env server of its own, built from it)."""

    env: str = ""
    """Name of an env in `[[orchestrator.envs]]` (declare an eval-only env there with `train = false`);
    required (not a required field, so that an env key written here is the error reported)."""
    sampling: dict[str, Any] = {}
    """Overrides of the env's `sampling` keys (themselves overrides of the orchestrator's) for its evals."""

    def scored_env(self) -> str:
        return self.env

    @model_validator(mode="after")
    def _names_an_env(self) -> EvalTableConfig:
        if not self.env:
            raise ValueError('missing `env`: name an env of [[orchestrator.envs]] with env = "<name>"')
        return self


def check_pass_at(scoring: EvalScoringConfig, name: str) -> None:
    """pass@k needs k rollouts per task: every k of `pass_at` within 1..rollouts_per_example."""
    bad = [k for k in scoring.pass_at if not 1 <= k <= scoring.rollouts_per_example]
    if bad:
        raise ValueError(
            f"eval env {name!r}: pass_at {bad} outside 1..rollouts_per_example ({scoring.rollouts_per_example}); "
            "raise rollouts_per_example or drop those k"
        )
