"""trl-count: a TRL-style environment class and reward functions; only the imports are envrl's.

Guarantee: what would be passed to TRL's `GRPOTrainer(environment_factory=..., reward_funcs=...,
train_dataset=...)` is passed to `TrlEnvironment` unchanged. Rows are a pure function of (seed,
index); the trained reward is the share of digits in the answer (a random tiny model learns it).
"""

from __future__ import annotations

import random
import re

from envrl.envs.adapters.trl import TrlEnvironment

SYSTEM_PROMPT = "Continue the count. Answer with numbers only."


class CountEnv:
    """TRL's environment_factory class: `reset` gets the dataset row, public methods are tools."""

    def reset(self, **row: object) -> str | None:
        self.start = int(row["start"])  # type: ignore[call-overload]
        self.calls = 0
        return None  # the prompt already shows the count

    def next_numbers(self, count: int) -> str:
        """The next numbers of the count after the ones shown.

        Args:
            count: How many numbers to return.
        """
        self.calls += 1
        return " ".join(str(self.start + n) for n in range(count))


def last_answer(completion: list[dict]) -> str:
    """The text of the model's last message (a completion may end with a tool's reply)."""
    return next((m["content"] or "" for m in reversed(completion) if m["role"] == "assistant"), "")


def digit_share(completions: list[list[dict]], **kwargs: object) -> list[float]:
    """Share of the last answer's non-space characters that are digits (TRL reward function)."""
    rewards = []
    for completion in completions:
        chars = [c for c in last_answer(completion) if not c.isspace()]
        rewards.append(sum(c in "0123456789" for c in chars) / len(chars) if chars else 0.0)
    return rewards


def continues_count(
    completions: list[list[dict]], next_number: list[int | None], **kwargs: object
) -> list[float | None]:
    """1 if the answer starts with the next number of the count; None (not applicable) for rows without one."""
    rewards: list[float | None] = []
    for completion, expected in zip(completions, next_number, strict=True):
        first = re.match(r"\s*(\d+)", last_answer(completion))
        rewards.append(None if expected is None else float(first is not None and int(first.group(1)) == expected))
    return rewards


def make_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        start, length = rng.randrange(0, 900), rng.randint(2, 5)
        prompt = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": " ".join(str(n) for n in range(start, start + length))},
        ]
        rows.append({"prompt": prompt, "start": start + length, "next_number": start + length if i % 2 else None})
    return rows


def load_environment(num_train: int = 256, num_eval: int = 32, seed: int = 0) -> TrlEnvironment:
    return TrlEnvironment(
        dataset=lambda: make_rows(num_train, seed),
        eval_dataset=lambda: make_rows(num_eval, seed + 1),
        environment_factory=CountEnv,
        reward_funcs=[digit_share, continues_count],
        reward_weights=[1.0, 0.0],  # continues_count is logged, not trained on
        max_turns=2,
    )
