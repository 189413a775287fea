"""learnable: continue a count using digits only; reward is the share of digit characters.

Guarantee: the reward of a completion is `digits / non-space characters` of its text (0 for an
empty answer), a graded value in [0, 1]; tasks are a pure function of (seed, split, index).
Why a randomly initialised model can learn it by RL alone: see the README.
"""

from __future__ import annotations

import random

from envrl.envs import Environment, Rubric
from envrl.traces import Task

SYSTEM_PROMPT = "Continue the count. Answer with numbers only."


class CountTask(Task):
    prompt: str


def digit_fraction(completion: str) -> float:
    """Share of the answer's non-space characters that are ASCII digits (0 for an empty answer)."""
    chars = [c for c in completion if not c.isspace()]
    return sum(c in "0123456789" for c in chars) / len(chars) if chars else 0.0


def make_tasks(count: int, seed: int) -> list[CountTask]:
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        start = rng.randrange(0, 900)
        tasks.append(CountTask(idx=i, prompt=" ".join(str(n) for n in range(start, start + rng.randint(2, 5)))))
    return tasks


def load_environment(num_train: int = 256, num_eval: int = 32, seed: int = 0) -> Environment:
    return Environment(
        tasks=lambda: make_tasks(num_train, seed),
        eval_tasks=lambda: make_tasks(num_eval, seed + 1),
        rubric=Rubric({digit_fraction: 1.0}),
        system_prompt=SYSTEM_PROMPT,
    )
