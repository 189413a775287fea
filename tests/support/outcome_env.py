"""An environment whose rollouts hang or raise on chosen seeds, for the outcome and refill tests
(loaded as 'outcome_env:load_environment').

Each rollout appends `<seed> <pid>` to `<marker_dir>/runs` when it starts, so the test counts the
rollouts run across worker processes; the rollout whose seed is `hang_seed` also writes its
worker's pid to `<marker_dir>/hang` and waits until that worker is killed; the one whose seed is
`raise_seed` raises from the env's own code. The others take `sleep_s` and score `seed % 2`, so a
group's rewards differ.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from envrl.data.traces import Task, Trace
from envrl.envs import Environment, ModelClient, Rubric, SamplingArgs


class PromptTask(Task):
    prompt: str


def zero() -> float:
    return 0.0


class OutcomeEnv(Environment):
    def __init__(self, marker_dir: Path, hang_seed: int | None, raise_seed: int | None, sleep_s: float) -> None:
        super().__init__(tasks=[PromptTask(idx=i, prompt=f"task {i}") for i in range(4)], rubric=Rubric({zero: 1.0}))
        self.marker_dir = marker_dir
        self.hang_seed = hang_seed
        self.raise_seed = raise_seed
        self.sleep_s = sleep_s

    async def run_group(
        self, task: Task, client: ModelClient, sampling: SamplingArgs, n: int, *, scoring_timeout: float | None = None
    ) -> list[Trace]:
        assert n == 1, "the tests run a per-rollout env: one rollout per call"
        with (self.marker_dir / "runs").open("a") as f:
            f.write(f"{sampling.seed} {os.getpid()}\n")
        if sampling.seed == self.hang_seed:
            (self.marker_dir / "hang").write_text(str(os.getpid()))
            await asyncio.sleep(3600)
        if sampling.seed == self.raise_seed:
            raise RuntimeError(f"the env's own code failed on seed {sampling.seed}")
        await asyncio.sleep(self.sleep_s)
        traces = await super().run_group(task, client, sampling, n, scoring_timeout=scoring_timeout)
        for trace in traces:
            trace.reward = float((sampling.seed or 0) % 2)
        return traces


def load_environment(
    marker_dir: str, hang_seed: int | None = None, raise_seed: int | None = None, sleep_s: float = 0.0
) -> OutcomeEnv:
    return OutcomeEnv(Path(marker_dir), hang_seed, raise_seed, sleep_s)
