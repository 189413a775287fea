"""Environments that misbehave on purpose, for env-server tests (loaded as 'bad_envs:load_environment').

Task i behaves as BEHAVIOURS[i]: a normal rollout, one that sleeps, one that raises out of
run_group (breaking the never-raise contract), one that hangs, one that burns the CPU
without ever yielding, one that SIGKILLs its own worker process, and one that returns a Trace
msgpack cannot carry (a set in its task). With `hold` (a path), loading waits while that file
exists: a worker started then stays in its start-up, before it connects to its server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from envrl.data.traces import Task, Trace, WireTask
from envrl.envs import Environment, ModelClient, Rubric, SamplingArgs

BEHAVIOURS = ("ok", "sleep", "raise", "hang", "burn", "die", "unencodable")
OK, SLEEP, RAISE, HANG, BURN, DIE, UNENCODABLE = range(len(BEHAVIOURS))


class BehaviourTask(Task):
    prompt: str
    behaviour: str


async def constant_reward() -> float:
    return 1.0


class BadEnv(Environment):
    def __init__(self, sleep: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sleep = sleep

    async def run_group(
        self, task: Task, client: ModelClient, sampling: SamplingArgs, n: int, *, scoring_timeout: float | None = None
    ) -> list[Trace]:
        assert isinstance(task, BehaviourTask)
        if task.behaviour == "sleep":
            await asyncio.sleep(self.sleep)
        elif task.behaviour == "raise":
            raise RuntimeError("bad env raised on purpose")
        elif task.behaviour == "hang":
            await asyncio.sleep(3600)
        elif task.behaviour == "burn":
            while True:
                pass
        elif task.behaviour == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        elif task.behaviour == "unencodable":
            return [Trace(task=WireTask(idx=task.idx, tags={"a", "b"}), reward=1.0)] * n
        return await super().run_group(task, client, sampling, n, scoring_timeout=scoring_timeout)


def load_environment(sleep: float = 1.0, hold: str | None = None) -> BadEnv:
    while hold is not None and Path(hold).exists():
        time.sleep(0.05)
    tasks = [BehaviourTask(idx=i, prompt=f"task {i}: {b}", behaviour=b) for i, b in enumerate(BEHAVIOURS)]
    return BadEnv(sleep, tasks=tasks, eval_tasks=tasks[:1], rubric=Rubric({constant_reward: 1.0}))
