"""digits-count: a verifiers v1 taskset (written for verifiers, not for envrl).

Guarantee: task i of a (seed, num_tasks) config is always the same count start; the reward of a
rollout is `digits / non-space characters` of the model's replies (0 for no text), in [0, 1].
A randomly initialised tiny model writes some digits by chance, so RL has a signal from step 1.
"""

from __future__ import annotations

import random

import verifiers.v1 as vf
from verifiers.v1.types import content_text

SYSTEM_PROMPT = "Continue the count. Answer with numbers only."


class DigitsData(vf.TaskData):
    """One count start, e.g. "412 413 414"."""

    start: int


class DigitsTask(vf.Task[DigitsData]):
    @vf.reward(weight=1.0)
    async def digit_share(self, trace: vf.Trace) -> float:
        chars = [c for m in trace.assistant_messages for c in content_text(m.content) if not c.isspace()]
        return sum(c in "0123456789" for c in chars) / len(chars) if chars else 0.0


class DigitsConfig(vf.TasksetConfig):
    num_tasks: int = 256
    """How many count starts to build."""
    seed: int = 0


class DigitsTaskset(vf.Taskset[DigitsTask, DigitsConfig]):
    def load(self) -> list[DigitsTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            start = rng.randrange(0, 900)
            count = " ".join(str(n) for n in range(start, start + rng.randint(2, 5)))
            tasks.append(
                DigitsTask(DigitsData(prompt=count, system_prompt=SYSTEM_PROMPT, start=start), self.config.task)
            )
        return tasks
