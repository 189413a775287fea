"""reverse-text as envrl 0.1 shipped it (deps/envs/reverse-text at commit a807e21), byte for byte
below this docstring: an env written against 0.1's documented imports (`envrl.traces`), which
tests/unit/envs/test_public_api.py loads unchanged."""

from __future__ import annotations

import random
import string

from envrl.envs import Environment, Rubric
from envrl.traces import Message, Task

SYSTEM_PROMPT = "Reverse the text the user gives you, character by character. Answer with the reversed text only."


class ReverseTask(Task):
    text: str

    @property
    def target(self) -> str:
        return self.text[::-1]


def lcs_length(a: str, b: str) -> int:
    """Longest common subsequence length (dynamic programming, one row at a time)."""
    row = [0] * (len(b) + 1)
    for ca in a:
        diagonal = 0
        for j, cb in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if ca == cb else max(row[j], row[j - 1])
    return row[-1]


def lcs_ratio(completion: str, text: str) -> float:
    """2·LCS / (len(answer) + len(truth)): 1 for the exact reversal, 0 for nothing in common."""
    answer, truth = completion.strip(), text[::-1]
    if not answer and not truth:
        return 1.0
    return 2 * lcs_length(answer, truth) / (len(answer) + len(truth))


def make_tasks(count: int, seed: int, min_len: int, max_len: int) -> list[ReverseTask]:
    rng = random.Random(seed)
    return [
        ReverseTask(idx=i, text="".join(rng.choices(string.ascii_lowercase, k=rng.randint(min_len, max_len))))
        for i in range(count)
    ]


class ReverseTextEnv(Environment):
    def prompt(self, task: Task) -> list[Message]:
        assert isinstance(task, ReverseTask)
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.text}]


def load_environment(
    num_train: int = 1000, num_eval: int = 100, seed: int = 0, min_len: int = 5, max_len: int = 20
) -> ReverseTextEnv:
    return ReverseTextEnv(
        tasks=lambda: make_tasks(num_train, seed, min_len, max_len),
        eval_tasks=lambda: make_tasks(num_eval, seed + 1, min_len, max_len),
        rubric=Rubric({lcs_ratio: 1.0}),
    )
