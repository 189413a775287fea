"""The `learnable` count task scored by a scorer each env worker process runs one call at a time
(loaded as 'tests.support.slow_scoring_env:load_environment'): a run bound by env scoring, whose
rollouts wait for a worker (configs/debug/bound_scoring.toml)."""

from __future__ import annotations

import asyncio

from learnable import SYSTEM_PROMPT, digit_fraction, make_tasks

from envrl.envs import Environment, Rubric


class OneScorer:
    """A worker's scorer: `score_s` seconds a call, one call at a time (a judge with one slot)."""

    def __init__(self, score_s: float) -> None:
        self.score_s = score_s
        self._slot: asyncio.Lock | None = None

    async def __call__(self, completion: str) -> float:
        self._slot = self._slot or asyncio.Lock()
        async with self._slot:
            await asyncio.sleep(self.score_s)
        return digit_fraction(completion)


def load_environment(score_s: float = 0.25, num_train: int = 256, seed: int = 0) -> Environment:
    return Environment(
        tasks=lambda: make_tasks(num_train, seed),
        eval_tasks=lambda: make_tasks(8, seed + 1),
        rubric=Rubric({OneScorer(score_s): 1.0}),
        system_prompt=SYSTEM_PROMPT,
    )
