"""Config of the orchestrator: its envs, batch shape, async bound, sampling and outputs.

Guarantee: an `OrchestratorConfig` that validates declares every env once (`envs`), uniquely
named, with unique addresses, at least one of them trained on, ratios on all train envs or on
none; every eval table names one declared env (each at most once) and every env not trained on
is evaluated; and a batch holds whole groups.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from envrl.config import BaseConfig, ConfigError, ModelConfig
from envrl.model.client import EvalClientConfig, SamplingArgs, SamplingParams
from envrl.model.replicas import ReplicaUrls, replica_urls
from envrl.orchestrator.advantage import AdvantageConfig
from envrl.orchestrator.retention import BatchRetention
from envrl.orchestrator.trajectories import SeqLenPolicy
from envrl.runtime.http import RetryPolicy
from envrl.runtime.net import is_loopback
from envrl.runtime.process import RestartPolicy
from envrl.runtime.secrets import RELOAD_TOKEN_ENV
from envrl.serve.config import (
    CurveClientConfig,
    ElasticPoolConfig,
    EnvServerConfig,
    EnvSpec,
    EnvTimeoutConfig,
    ModelAccessConfig,
    PoolConfig,
)
from envrl.serve.launch import EnvServerLaunch
from envrl.telemetry.log import LogConfig
from envrl.telemetry.metrics import WandbConfig

UNTRAINABLE_SAMPLING = ("min_p", "logit_bias", "min_tokens", "repetition_penalty", "presence_penalty",
                        "frequency_penalty", "bad_words", "allowed_token_ids")  # fmt: skip
"""vLLM sampling options that reshape the distribution tokens are drawn from; vLLM's logprobs
include them but the trainer's do not, so every importance ratio would be off."""


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
    """CURVE keys for an external server off loopback (`server_public_key_file`, `secret_key_file`):
    the server authenticates this client and the traffic is encrypted (docs/protocol.md)."""
    insecure: bool = False
    """Connect to a non-loopback `address` without CURVE (plain TCP: anyone on the path reads and
    injects rollouts); only for networks you trust."""
    pool: PoolConfig = ElasticPoolConfig()
    """Worker pool of a spawned sidecar server."""
    max_retries: int = Field(2, ge=0)
    """Re-runs of a rollout that came back with an error before it counts as failed."""
    reconnect_timeout_s: float = Field(300.0, gt=0)
    """Seconds to wait for a lost env server (connection dropped, or silent) to answer again before
    the orchestrator fails; rollouts lost with it are re-run once it is back."""
    pass_env: list[str] = []
    """Variables of the launcher's environment a spawned server of this env (its workers, the
    programs they run) gets beyond the allow-list of locale, paths, caches and proxies
    (`envrl.runtime.process.ALLOWED_ENV`), e.g. `["OPENAI_API_KEY"]`; a model client's `api_key_env` is
    passed by itself. Tokens and keys not listed never reach model-driven code."""
    timeout: EnvTimeoutConfig = EnvTimeoutConfig()
    sampling: dict[str, Any] = {}
    """Overrides of the orchestrator's `sampling` keys for this env."""
    client: EvalClientConfig | None = None
    """A chat model this env's rollouts talk to instead of the run's own (a teacher behind an
    OpenAI API, say: `base_url`, `model`, `api_key_env`); default: the train client of the run's
    inference server. Its turns are token-less, which training back-fills with the student's chat
    template (their tokens count as on-policy: importance ratio 1)."""

    renamed_keys: ClassVar[dict[str, str]] = {"reconnect_timeout": "reconnect_timeout_s"}
    removed_keys: ClassVar[dict[str, str]] = {
        "restarts": "one restart policy: under rl every env server follows the top-level `restarts` (each "
        "its own budget); a standalone orchestrator's sidecars follow `orchestrator.restarts`"
    }

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
        self, split: str, address: str, model_access: ModelAccessConfig, restarts: RestartPolicy
    ) -> EnvServerLaunch:
        """The server of this env on `address`, for whoever starts it (serve/launch.py) and restarts
        it per `restarts`; a model client may reach and load only what `model_access` allows."""
        return EnvServerLaunch(
            split=split,
            name=self.resolved_name,
            config=EnvServerConfig(
                env=EnvSpec(id=self.id, args=self.args),
                address=address,
                pool=self.pool,
                timeout=self.timeout,
                model_access=model_access,
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


class TrainEnvConfig(EnvConfig):
    """An env of the run (`[[orchestrator.envs]]`): every env server of the run is declared here
    once; trained on unless `train = false`, evaluated when an `[[orchestrator.eval.env]]` names it."""

    train: bool = True
    """Sample train rollouts from it; `false`: an env only evaluated (an eval table names it)."""
    ratio: float | None = Field(None, gt=0)
    """Share of train rollouts (relative); set on every train env or on none (then: by task count)."""

    @model_validator(mode="after")
    def _ratio_is_for_training(self) -> TrainEnvConfig:
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

    removed_keys: ClassVar[dict[str, str]] = {
        key: f"one schedule for every eval env: set orchestrator.eval.{key} (`rl eval` evaluates once)"
        for key in ("interval", "at_start", "at_end")
    }

    @model_validator(mode="after")
    def _pass_at_fits(self) -> EvalScoringConfig:
        check_pass_at(self)
        return self


class EvalEnvConfig(EnvConfig, EvalScoringConfig):
    """An eval env with its server's keys: `rl eval`'s `[[env]]`, and the orchestrator's view of
    an `[[orchestrator.eval.env]]` table completed by the env it names (`OrchestratorConfig.eval_envs`)."""


class EvalTableConfig(EvalScoringConfig):
    """`[[orchestrator.eval.env]]`: a declared env (`env`) and how it is scored; its server's keys
    are the declaration's (one env server of its own, built from it)."""

    env: str = ""
    """Name of an env in `[[orchestrator.envs]]` (declare an eval-only env there with `train = false`);
    required (not a required field, so that an env key written here is the error reported)."""
    sampling: dict[str, Any] = {}
    """Overrides of the env's `sampling` keys (themselves overrides of the orchestrator's) for its evals."""

    renamed_keys: ClassVar[dict[str, str]] = {"train_env": "env"}
    removed_keys: ClassVar[dict[str, str]] = {
        **EvalScoringConfig.removed_keys,
        **{
            key: "an eval env names a declared env: declare it in [[orchestrator.envs]] (with `train = false` "
            'for an eval-only env) and name it here with env = "<name>"'
            for key in TrainEnvConfig.model_fields
            if key != "sampling"
        },
    }

    @model_validator(mode="after")
    def _names_an_env(self) -> EvalTableConfig:
        if not self.env:
            raise ValueError('missing `env`: name an env of [[orchestrator.envs]] with env = "<name>"')
        return self


def check_pass_at(env: EvalScoringConfig) -> None:
    """pass@k needs k rollouts per task: every k of `pass_at` within 1..rollouts_per_example."""
    bad = [k for k in env.pass_at if not 1 <= k <= env.rollouts_per_example]
    if bad:
        name = env.env if isinstance(env, EvalTableConfig) else getattr(env, "resolved_name", "")
        raise ValueError(
            f"eval env {name!r}: pass_at {bad} outside 1..rollouts_per_example ({env.rollouts_per_example}); "
            "raise rollouts_per_example or drop those k"
        )


class EvalsConfig(BaseConfig):
    """`orchestrator.eval`: the eval envs and one schedule for all of them (evals run beside training)."""

    env: list[EvalTableConfig] = []
    """Eval envs: `env = "<name>"` of a declared env, plus num_examples, rollouts_per_example,
    pass_at, pass_threshold and sampling overrides (docs/config.md)."""
    interval: int = Field(10, ge=1)
    """Evaluate every `interval` steps."""
    at_start: bool = False
    """Also evaluate the initial policy, at step 0."""
    at_end: bool = True
    """Also evaluate the final policy after the last step (waiting for the trainer to publish it,
    at most `weights_timeout_s`)."""
    addresses: dict[str, str] = {}
    """The eval env servers `rl` spawned, by env name (set by rl). Without an entry an eval env
    uses its declaration's `address`, or the orchestrator spawns a server of its own."""

    def due(self, step: int) -> bool:
        """Whether the eval envs run before training step `step` (step 0: only `at_start`)."""
        return self.at_start if step == 0 else step % self.interval == 0


class InferenceClientConfig(BaseConfig):
    """The orchestrator's client of the inference servers; `rl` sets all of it for the servers it
    starts (their URLs, reload token and start-up limit; the default retry policy)."""

    base_url: ReplicaUrls = "http://127.0.0.1:8000"
    """The envrl inference server (vLLM), without /v1, or a list of replicas serving the same model
    (on this host or others; `rl` sets it from `inference.replicas`). Env servers spread model
    calls across them; each step's weights are loaded on all of them before the step dispatches."""
    ready_timeout_s: float = Field(600.0, gt=0)
    """Seconds to wait for the servers to answer at start-up (`rl` sets it from
    `inference.ready_timeout_s`, which its launcher counts from the servers' launch)."""
    retry: RetryPolicy = RetryPolicy()
    reload_token_env: str = RELOAD_TOKEN_ENV
    """Environment variable with the servers' `/update_weights` token, sent when set (a server
    off loopback requires it; see inference.reload)."""

    renamed_keys: ClassVar[dict[str, str]] = {"ready_timeout": "ready_timeout_s"}

    @property
    def base_urls(self) -> list[str]:
        """Every replica's URL (one for a single server)."""
        return replica_urls(self.base_url)


class OrchestratorConfig(BaseConfig):
    model: ModelConfig = ModelConfig()
    output_dir: Path = Path("outputs/run")
    """Run directory the batches, rollouts and metrics go to (and the trainer's weights come from)."""
    max_steps: int = Field(20, ge=1)
    """Training steps to produce batches for."""
    max_async_level: int = Field(1, ge=0)
    """Batch n may be generated by any policy >= n - max_async_level (0: fully on-policy)."""
    partial_rollouts: bool = False
    """Generations in flight at a weight reload go on under the new policy (their KV cache
    recomputed) instead of the reload waiting for them; each token keeps the policy step that
    sampled it, and `max_async_level` counts a group's oldest token (docs/scale.md)."""
    seed: int = 0
    """Seed of task order and every rollout's sampling seed (envrl.data.seeds)."""
    batch_size: int = Field(32, ge=1)
    """Rollouts per training step (a multiple of group_size)."""
    group_size: int = Field(4, ge=1)
    """Rollouts per task; advantages are relative to the group."""
    max_inflight: int | None = Field(None, ge=1)
    """Most train rollouts in flight across all train envs; each running eval is bounded by the
    same number on its own (evals run beside training). Default: batch_size * (max_async_level +
    1), the rollouts of every batch generation may be working on at once (`inflight_limit`)."""
    sampling: SamplingParams = SamplingParams()
    seq_len: int | None = Field(None, ge=2)
    """Most tokens of one training sample (None: no limit). Longer samples are handled per
    `seq_len_policy`; counted per env (`train/<env>/seq_truncated`, `seq_dropped`). Keep it
    <= trainer.micro_batch_tokens, or the trainer gives such samples a micro-batch of their own."""
    seq_len_policy: SeqLenPolicy = "truncate"
    """`truncate`: keep the first `seq_len` tokens (later tokens are not trained; a sample left
    with nothing to train is dropped). `drop`: leave the sample out of the batch."""
    advantage: AdvantageConfig = AdvantageConfig()
    envs: list[TrainEnvConfig] = Field(min_length=1)
    """Every env of the run, a list of tables: id, args, train, ratio, name, address, project,
    python, pool, timeout, max_retries, sampling, client, pass_env (docs/config.md,
    Environment tables). At least one is a train env; an eval table names the env it evaluates."""
    eval: EvalsConfig = EvalsConfig()
    inference: InferenceClientConfig = InferenceClientConfig()
    weights_timeout_s: float = Field(1800.0, gt=0)
    """Seconds to wait for the trainer's weights when generation is max_async_level steps ahead."""
    keep_weights: int = Field(2, ge=1)
    """Weight directories kept once the inference server has moved past them."""
    keep_weights_every: int = Field(0, ge=0)
    """Weight directories of steps that are multiples of this are kept for good (loadable with
    `from_pretrained`); 0 keeps none beyond `keep_weights`. Under `rl` it defaults to the
    trainer's `ckpt.interval`. The last step's weights are never deleted."""
    batch_retention: BatchRetention = "checkpoints"
    """`checkpoints`: delete each batch once a checkpoint after it exists (a resume, a trainer
    restart and `rl replay` read only the batches from a checkpoint on); `all`: keep every batch."""
    env_ready_timeout_s: float = Field(300.0, gt=0)
    """Seconds for a spawned env server to start, or an external one to answer."""
    restarts: RestartPolicy = RestartPolicy()
    """Restarts of each env server this orchestrator spawned (on its address, each with a budget
    of its own) when it dies; an external `address` is not restarted. Under `rl`, which starts the
    env servers itself, the run's `restarts`."""
    resume: bool = False
    """Continue from the orchestrator state saved in output_dir."""
    log: LogConfig = LogConfig()
    wandb: WandbConfig = WandbConfig()

    renamed_keys: ClassVar[dict[str, str]] = {
        "weights_timeout": "weights_timeout_s",
        "env_ready_timeout": "env_ready_timeout_s",
        "eval_envs": "eval.env",
    }

    @property
    def inflight_limit(self) -> int:
        """`max_inflight`, or its default derived from the batch shape and the async bound."""
        return self.max_inflight or self.batch_size * (self.max_async_level + 1)

    @property
    def train_envs(self) -> list[TrainEnvConfig]:
        """The envs train rollouts are sampled from (`train = true`)."""
        return [env for env in self.envs if env.train]

    def eval_envs(self) -> list[EvalEnvConfig]:
        """Each eval table completed by the env it names: the declaration's keys, its sampling
        overridden by the table's, the address of the server `rl` spawned for it (`eval.addresses`)."""
        declared = {env.resolved_name: env for env in self.envs}
        out = []
        for table in self.eval.env:
            env = declared[table.env]
            keys = {key: getattr(env, key) for key in EnvConfig.model_fields}
            keys |= {key: getattr(table, key) for key in EvalScoringConfig.model_fields}
            keys |= {
                "name": env.resolved_name,
                "address": self.eval.addresses.get(env.resolved_name, env.address),
                "sampling": {**env.sampling, **table.sampling},
            }
            out.append(EvalEnvConfig(**keys))
        return out

    @model_validator(mode="after")
    def _consistent(self) -> OrchestratorConfig:
        if self.inflight_limit < self.group_size:
            raise ValueError(
                f"max_inflight ({self.inflight_limit}) must hold at least one group (group_size {self.group_size})"
            )
        if self.batch_size % self.group_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of group_size ({self.group_size})")
        if not self.train_envs:
            raise ValueError("every env has `train = false`: declare at least one train env in `envs`")
        ratios = [env.ratio is not None for env in self.train_envs]
        if any(ratios) and not all(ratios):
            missing = [env.resolved_name for env in self.train_envs if env.ratio is None]
            raise ValueError(f"set `ratio` on every train env or on none; missing on {missing}")
        names = [env.resolved_name for env in self.envs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"envs: env names must be unique; {duplicates} used twice (set `name`)")
        addresses = [env.address for env in self.envs if env.address]
        duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
        if duplicates:
            raise ValueError(f"two envs share the address {duplicates[0]}; each env server serves one env")
        self._check_eval_names(names)
        for env in self.eval_envs():
            env.sampling_args(self.sampling)
        for env in self.train_envs:
            sampling = env.sampling_args(self.sampling)
            if sampling.temperature == 0:
                raise ValueError(
                    f"train env {env.resolved_name!r}: sampling.temperature is 0 (greedy): greedy tokens have no "
                    "sampling distribution to train on; use a temperature > 0 (greedy is for eval envs)"
                )
            untrainable = sorted(set(sampling.extra) & set(UNTRAINABLE_SAMPLING))
            if untrainable:
                raise ValueError(
                    f"env {env.resolved_name!r}: sampling.extra {untrainable} reshape the sampling distribution, "
                    "which the trainer cannot reproduce (its importance ratios would be wrong); remove them"
                )
        return self

    def _check_eval_names(self, names: list[str]) -> None:
        """Every eval table names a declared env, each at most once; every eval-only env is evaluated."""
        evaluated = [table.env for table in self.eval.env]
        for i, name in enumerate(evaluated):
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ValueError(
                    f"eval.env[{i}].env {name!r} is not a declared env; {hint}envs: {names} "
                    "(declare an eval-only env in [[orchestrator.envs]] with `train = false`)"
                )
        twice = sorted({n for n in evaluated if evaluated.count(n) > 1})
        if twice:
            raise ValueError(f"eval.env: {twice} evaluated twice; one eval table per env")
        unused = [env.resolved_name for env in self.envs if not env.train and env.resolved_name not in evaluated]
        if unused:
            raise ValueError(
                f"envs {unused} have `train = false` but no eval table names them; "
                'add [[orchestrator.eval.env]] env = "<name>" or remove them'
            )
