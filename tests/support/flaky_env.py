"""An environment whose rollouts fail until they have been tried `failures` times (per task).

Loaded by the orchestrator tests as 'flaky_env:load_environment'; attempts are recorded (one
line each, holding the attempt's sampling seed) in files under `marker_dir`, so the count
survives worker processes.
"""

from __future__ import annotations

from pathlib import Path

from envrl.data.traces import Task, Trace
from envrl.envs import Environment, ModelClient, Rubric, SamplingArgs


class PromptTask(Task):
    prompt: str


def one() -> float:
    return 1.0


class FlakyEnv(Environment):
    def __init__(self, marker_dir: Path, failures: int) -> None:
        super().__init__(tasks=[PromptTask(idx=i, prompt=f"task {i}") for i in range(4)], rubric=Rubric({one: 1.0}))
        self.marker_dir = marker_dir
        self.failures = failures

    async def run_group(
        self, task: Task, client: ModelClient, sampling: SamplingArgs, n: int, *, scoring_timeout: float | None = None
    ) -> list[Trace]:
        attempts = self.marker_dir / f"task_{task.idx}"
        with attempts.open("a") as f:
            f.write(f"{sampling.seed}\n")
        tried = len(attempts.read_text().splitlines())
        if tried <= self.failures:
            raise RuntimeError(f"flaky failure {tried} of task {task.idx}")
        return await super().run_group(task, client, sampling, n, scoring_timeout=scoring_timeout)


def load_environment(marker_dir: str, failures: int = 1) -> FlakyEnv:
    return FlakyEnv(Path(marker_dir), failures)
