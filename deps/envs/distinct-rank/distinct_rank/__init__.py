"""distinct-rank: write a varied sentence; rollouts are rewarded by their rank within the group.

Guarantee: the group reward of a rollout is its normalised rank (0 = worst, 1 = best, ties
share the average) by the number of distinct letters in its answer among the rollouts of the
same task, so the rewards of a group always average 0.5 and only comparisons matter.
"""

from __future__ import annotations

import random

from envrl.envs import Environment, Rubric, Task

TOPICS = ["the sea", "a game", "the moon", "a tool", "a letter", "the number seven", "a short trip", "rain"]


class TopicTask(Task):
    prompt: str


def distinct_letters(completion: str) -> float:
    return float(len({c for c in completion.lower() if c.isalpha()}))


def group_rank(completions: list[str]) -> list[float]:
    """Normalised rank of each answer by distinct letters; ties share their average rank."""
    scores = [distinct_letters(c) for c in completions]
    if len(scores) == 1:
        return [0.5]
    return [(sum(o < s for o in scores) + 0.5 * (sum(o == s for o in scores) - 1)) / (len(scores) - 1) for s in scores]


def make_tasks(count: int, seed: int) -> list[TopicTask]:
    rng = random.Random(seed)
    return [TopicTask(idx=i, prompt=f"Write one sentence about {rng.choice(TOPICS)}.") for i in range(count)]


def load_environment(num_train: int = 200, num_eval: int = 20, seed: int = 0) -> Environment:
    return Environment(
        tasks=lambda: make_tasks(num_train, seed),
        eval_tasks=lambda: make_tasks(num_eval, seed + 1),
        rubric=Rubric({distinct_letters: 0.0}, group={group_rank: 1.0}),
    )
