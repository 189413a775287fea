"""guess-number: find a hidden integer in a few guesses, told "higher" or "lower" after each.

Guarantee: a rollout ends when the number is guessed or after `max_turns` guesses; the reward
gives full credit for a solve (less for slow ones) and partial credit for the closest guess, so
a near miss scores above a wild one.
"""

from __future__ import annotations

import random
import re

from envrl.envs import Environment, Message, RolloutState, Rubric, Task

SYSTEM_PROMPT = "Guess my secret whole number. After each guess I say higher, lower or correct. Answer with one number."


class GuessTask(Task):
    target: int
    low: int
    high: int


def last_integer(text: str) -> int | None:
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


class GuessNumberEnv(Environment):
    def prompt(self, task: Task) -> list[Message]:
        assert isinstance(task, GuessTask)
        question = f"The number is between {task.low} and {task.high}. Your guess?"
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]

    async def env_response(self, state: RolloutState) -> list[Message]:
        task = state.task
        assert isinstance(task, GuessTask)
        guess = last_integer(state.completion)
        if guess is None:
            return [{"role": "user", "content": "That is not a number. Answer with one whole number."}]
        state.data.setdefault("guesses", []).append(guess)
        if guess == task.target:
            state.stop("completed")
            return [{"role": "user", "content": "Correct!"}]
        return [{"role": "user", "content": "Higher." if guess < task.target else "Lower."}]


def solved(state: RolloutState, target: int) -> float:
    """1 for guessing the number, minus 0.1 for every extra guess it took (at least 0.5)."""
    guesses = state.data.get("guesses", [])
    if target not in guesses:
        return 0.0
    return max(0.5, 1.0 - 0.1 * guesses.index(target))


def closeness(state: RolloutState, target: int, low: int, high: int) -> float:
    """1 - (distance of the closest guess) / (range width); 0 without a valid guess."""
    guesses = state.data.get("guesses", [])
    if not guesses:
        return 0.0
    return max(0.0, 1.0 - min(abs(g - target) for g in guesses) / (high - low))


def num_guesses(state: RolloutState) -> float:
    return float(len(state.data.get("guesses", [])))


def make_tasks(count: int, seed: int, low: int, high: int) -> list[GuessTask]:
    rng = random.Random(seed)
    return [GuessTask(idx=i, target=rng.randint(low, high), low=low, high=high) for i in range(count)]


def load_environment(
    num_train: int = 1000, num_eval: int = 100, seed: int = 0, low: int = 1, high: int = 100, max_turns: int = 8
) -> GuessNumberEnv:
    return GuessNumberEnv(
        tasks=lambda: make_tasks(num_train, seed, low, high),
        eval_tasks=lambda: make_tasks(num_eval, seed + 1, low, high),
        rubric=Rubric({solved: 1.0, closeness: 0.5, num_guesses: 0.0}),
        max_turns=max_turns,
    )
