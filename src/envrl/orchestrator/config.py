"""Config of the orchestrator: a valid one declares every env once, uniquely named and addressed, at least one
trained, every eval table naming one declared env, and batches of whole groups."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator

from envrl.config import BaseConfig, RunKeys
from envrl.envclient.config import (
    DeclaredEnvConfig,
    EnvConfig,
    EvalTableConfig,
)
from envrl.model.client import SamplingParams, TrainClientConfig
from envrl.model.replicas import ReplicaUrls, replica_urls
from envrl.orchestrator.advantage import AdvantageConfig
from envrl.orchestrator.checks import ChecksConfig
from envrl.orchestrator.distill import DistillConfig
from envrl.orchestrator.retention import BatchRetention
from envrl.orchestrator.trajectories import SeqLenPolicy
from envrl.runtime.http import RetryPolicy
from envrl.runtime.restarts import RestartPolicy
from envrl.runtime.secrets import RELOAD_TOKEN_ENV
from envrl.telemetry.log import LogConfig
from envrl.telemetry.metrics import WandbConfig

UNTRAINABLE_SAMPLING = ("min_p", "logit_bias", "min_tokens", "repetition_penalty", "presence_penalty",
                        "frequency_penalty", "bad_words", "allowed_token_ids")  # fmt: skip
"""vLLM sampling options that reshape the distribution tokens are drawn from; vLLM's logprobs
include them but the trainer's do not, so every importance ratio would be off."""


class TrainEvalsConfig(BaseConfig):
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
    (on this host or others; `rl` sets it from `placement.inference.replicas`). Env servers spread model
    calls across them; each step's weights are loaded on all of them before the step dispatches."""
    ready_timeout_s: float = Field(600.0, gt=0)
    """Seconds to wait for the servers to answer at start-up (`rl` sets it from
    `inference.ready_timeout_s`, which its launcher counts from the servers' launch)."""
    retry: RetryPolicy = RetryPolicy()
    reload_token_env: str = RELOAD_TOKEN_ENV
    """Environment variable with the servers' `/update_weights` token, sent when set (a server
    off loopback requires it; see inference.reload)."""

    @property
    def base_urls(self) -> list[str]:
        """Every replica's URL (one for a single server)."""
        return replica_urls(self.base_url)


class OrchestratorConfig(RunKeys):
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
    distill: DistillConfig | None = None
    """On-policy distillation: per-token reverse KL to a teacher server as the advantage, alone or
    mixed with the env's (`orchestrator/distill.py`, docs/distill.md); off when unset."""
    refill_rollouts: int = Field(8, ge=0)
    """Rollouts per step that may be run again, one by one, after an infrastructure failure (a dead
    env worker or server, model server or sandbox, with its retries spent): the failed rollout is
    re-run, not its group. Past the budget a failed rollout only leaves its group's baseline
    (docs/running.md, Outcomes). 0: never."""
    envs: list[DeclaredEnvConfig] = Field(min_length=1)
    """Every env of the run, a list of tables: id, args, train, ratio, name, address, project,
    python, pool, timeout, max_retries, sampling, client, pass_env (docs/config.md,
    Environment tables). At least one is a train env; an eval table names the env it evaluates."""
    eval: TrainEvalsConfig = TrainEvalsConfig()
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
    env_ready_timeout_s: ClassVar[float] = 300.0
    """Seconds for a spawned env server to start, or an external one to answer."""
    restarts: RestartPolicy = RestartPolicy()
    """Restarts of each env server this orchestrator spawned (on its address, each with a budget
    of its own) when it dies; an external `address` is not restarted. Under `rl`, which starts the
    env servers itself, the run's `restarts`."""
    resume: bool = False
    """Continue from the orchestrator state saved in output_dir."""
    checks: ChecksConfig = ChecksConfig()
    """Checks that warn (or stop the run, `strict`) when it cannot learn or stops progressing (docs/config.md)."""
    log: LogConfig = LogConfig()
    wandb: WandbConfig = WandbConfig()

    @property
    def inflight_limit(self) -> int:
        """`max_inflight`, or its default derived from the batch shape and the async bound."""
        return self.max_inflight or self.batch_size * (self.max_async_level + 1)

    @property
    def train_envs(self) -> list[DeclaredEnvConfig]:
        """The envs train rollouts are sampled from (`train = true`)."""
        return [env for env in self.envs if env.train]

    def train_client(self) -> TrainClientConfig:
        """The run's own model client (token-in/token-out on its inference servers), for every env
        without a `client` of its own."""
        model = self.model.name
        tokenizer = str(Path(model).resolve()) if Path(model).exists() else model
        return TrainClientConfig(
            base_url=self.inference.base_url, model=model, tokenizer=tokenizer, retry=self.inference.retry
        )

    def eval_envs(self) -> list[EnvConfig]:
        """The env of each eval table (`eval.env`, in order; the table is how it is scored): its
        declaration's keys, its sampling overridden by the table's, the address of the server `rl`
        spawned for it (`eval.addresses`)."""
        declared = {env.resolved_name: env for env in self.envs}
        out = []
        for table in self.eval.env:
            env = declared[table.env]
            keys = {key: getattr(env, key) for key in EnvConfig.model_fields}
            keys |= {
                "name": env.resolved_name,
                "address": self.eval.addresses.get(env.resolved_name, env.address),
                "sampling": {**env.sampling, **table.sampling},
            }
            out.append(EnvConfig(**keys))
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
