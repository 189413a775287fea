"""A training run's evaluations: due ones run beside training (the first failure raised at the next step), the final
policy on every eval env at the end; each is the env's whole grid, logged for its step with its policy step."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from loguru import logger

from envrl.data.layout import eval_rollouts_file
from envrl.envclient.config import EvalScoringConfig
from envrl.envclient.eval_grid import EvalGrid, run_grids
from envrl.envclient.handles import EnvHandle
from envrl.orchestrator.background_evals import BackgroundEvals
from envrl.orchestrator.config import TrainEvalsConfig
from envrl.orchestrator.policy import PolicyTracker
from envrl.orchestrator.rollout_files import append_rollouts
from envrl.telemetry.metrics import MetricsSink


class TrainEvals:
    """The run's eval envs, when they are evaluated, and the evaluations running beside training;
    `envs[i]` is the env of `schedule.env[i]`, the table that says how it is scored."""

    def __init__(
        self,
        envs: list[EnvHandle],
        schedule: TrainEvalsConfig,
        *,
        seed: int,
        max_inflight: int,
        output_dir: Path,
        sink: MetricsSink,
    ) -> None:
        self.envs = envs
        self.scored: list[tuple[EnvHandle, EvalScoringConfig]] = list(zip(envs, schedule.env, strict=True))
        self.schedule = schedule
        self.seed, self.max_inflight, self.output_dir, self.sink = seed, max_inflight, output_dir, sink
        self.running = BackgroundEvals()

    def raise_failure(self) -> None:
        """Raise the first failure of an eval running beside training (the run must not go on blind)."""
        self.running.raise_failure()

    def start_due(self, step: int, policy_step: int) -> None:
        """Start the evals due before step `step`, beside training."""
        if self.schedule.due(step):
            for env, scoring in self.scored:
                self.running.start(self.evaluate(env, scoring, step, policy_step))

    async def at_end(self, step: int, policy: PolicyTracker) -> None:
        """Evaluate policy `step` on every eval env (`eval.at_end`), then wait for the interval
        evals still running; raise the first failure."""
        if self.envs and self.schedule.at_end:
            logger.info(f"waiting for the final policy {step} to evaluate it on {[env.name for env in self.envs]}")
            await policy.ensure(step + policy.max_async_level)
            await asyncio.gather(*(self.evaluate(env, scoring, step, policy.current) for env, scoring in self.scored))
        await self.running.wait()

    async def evaluate(self, env: EnvHandle, scoring: EvalScoringConfig, step: int, policy_step: int) -> None:
        """Evaluate the served policy (`policy_step`) on `env`'s grid, logged as step `step`'s."""
        started = time.monotonic()
        grid = EvalGrid(env, scoring, seed=self.seed)
        await run_grids([grid], self.max_inflight)
        path = eval_rollouts_file(self.output_dir, step)
        for group in grid.groups():
            append_rollouts(path, step, env.name, policy_step, group)
        metrics = {f"eval/{env.name}/{key}": value for key, value in grid.summary().items()}
        metrics[f"eval/{env.name}/policy_step"] = policy_step
        self.sink.log(step, metrics)
        self.sink.log_samples(step, f"eval/{env.name}/samples", [t for group in grid.groups() for t in group])
        logger.info(
            f"eval {env.name!r} at step {step} (policy {policy_step}): reward {metrics[f'eval/{env.name}/reward']:.3f}, "
            f"{grid.n * grid.r} rollouts in {time.monotonic() - started:.1f} s -> {path}"
        )

    async def close(self) -> None:
        await self.running.close()
