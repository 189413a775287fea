"""`rl eval`'s config: the envs to evaluate, how each is scored and the model it runs on, checked
when loaded; `eval_envs` plans them as `rl` and the orchestrator plan theirs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator

from envrl.config import BaseConfig, ModelConfig
from envrl.data.layout import eval_results_file
from envrl.envclient.config import EnvConfig, EvalScoringConfig, check_pass_at
from envrl.envclient.curve import sidecar_keys
from envrl.envclient.plan import PlannedEnv, env_plan
from envrl.model.client import ClientConfig, EvalClientConfig, SamplingParams
from envrl.runtime.restarts import RestartPolicy
from envrl.telemetry.log import LogConfig

DEFAULT_CLIENT = EvalClientConfig(base_url="http://127.0.0.1:8000/v1", model=ModelConfig().name)
"""The chat client of an envrl inference server on its default port, serving the default model."""


class EvalInputError(Exception):
    """Input `eval` cannot work with (earlier results in the way or out of shape), as one line."""


class EvalCommandEnvConfig(EnvConfig, EvalScoringConfig):
    """`rl eval`'s `[[env]]`: an env with its server's keys and how it is scored, in one flat table;
    `EnvHandle` reads it as the env, `EvalGrid` as the scoring."""

    def scored_env(self) -> str:
        return self.resolved_name


class EvalCommandConfig(BaseConfig):
    """Config of the `eval` entry point."""

    cli_aliases: ClassVar[dict[str, str]] = {"n": "num-examples", "r": "rollouts-per-example"}

    env: list[EvalCommandEnvConfig] = Field(min_length=1)
    """Envs to evaluate: one table (`--env.id reverse-text`) or several (`[[env]]` in TOML)."""
    num_examples: int | None = Field(None, ge=1)
    """Tasks per env, 0..n-1 of its eval split (-n); when set, replaces every env's own `num_examples`."""
    rollouts_per_example: int | None = Field(None, ge=1)
    """Rollouts per task (-r); when set, replaces every env's own `rollouts_per_example`."""
    client: ClientConfig = DEFAULT_CLIENT
    """The model under evaluation (an env with a `client` of its own is evaluated on that one); a
    chat client table (`type` eval or none) changes keys of the default one."""
    sampling: SamplingParams = SamplingParams()
    max_inflight: int = Field(32, ge=1)
    """Most rollouts in flight across all envs (a group-scored task's rollouts go out together)."""
    seed: int = 0
    """Rollout (task i, rollout j) always gets the same sampling seed, derived from this one."""
    output_dir: Path = Path("outputs/eval")
    """Results go to `<output_dir>/eval/<env>.jsonl`, env server logs to `<output_dir>/logs/envs/eval/`."""
    resume: Path | None = None
    """An earlier eval's output_dir: keep its successful rollouts, re-run the rest, write results there."""
    max_error_rate: float | None = Field(None, ge=0, le=1)
    """Exit 1 when more than this share of an env's rollouts failed (None: only when all of them did)."""
    env_ready_timeout_s: float = Field(300.0, gt=0)
    """Seconds for a spawned env server to start, or an external one to answer."""
    restarts: RestartPolicy = RestartPolicy()
    """Restarts of each env server `eval` spawned (on its address, each its own budget) when it dies."""
    log: LogConfig = LogConfig()

    @field_validator("env", mode="before")
    @classmethod
    def _one_table_is_one_env(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("env")
    @classmethod
    def _unique_names(cls, envs: list[EvalCommandEnvConfig]) -> list[EvalCommandEnvConfig]:
        names = [env.resolved_name for env in envs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"env names must be unique; {duplicates} used twice (set `name`)")
        return envs

    @field_validator("client", mode="before")
    @classmethod
    def _chat_client_by_default(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type", "eval") == "eval":
            return {**DEFAULT_CLIENT.model_dump(), **value}
        return value

    @field_validator("resume")
    @classmethod
    def _resume_writes_in_place(cls, resume: Path | None, info: ValidationInfo) -> Path | None:
        output_dir = info.data.get("output_dir")
        if resume is not None and output_dir not in (resume, cls.model_fields["output_dir"].default):
            raise ValueError(f"resuming writes the results back into {resume}; drop --output-dir {output_dir}")
        return resume

    @model_validator(mode="after")
    def _apply_overrides(self) -> EvalCommandConfig:
        """-n and -r into every env; env sampling keys checked; --resume is the output dir."""
        for env in self.env:
            env.sampling_args(self.sampling)
            if self.num_examples is not None:
                env.num_examples = self.num_examples
            if self.rollouts_per_example is not None:
                env.rollouts_per_example = self.rollouts_per_example
            check_pass_at(env, env.resolved_name)
        if self.resume is not None:
            self.output_dir = self.resume
        return self

    def results_file(self, env_name: str) -> Path:
        return eval_results_file(self.output_dir, env_name)


def eval_envs(config: EvalCommandConfig) -> list[PlannedEnv[EvalCommandEnvConfig]]:
    """Each env of `rl eval` (`env_plan`, as `rl` and the orchestrator plan theirs): its rollouts on
    its own `client` if it has one, else on `config.client`, at its `address` or on a server it
    spawns that admits only `eval`'s CURVE key (made by `Sidecars` in `<output_dir>/curve/`)."""
    return env_plan((), config.env, config.client, config.restarts, curve=sidecar_keys(config.output_dir))
