"""learnable: continue a count using digits only; reward is the share of digit characters.

Guarantee: the reward of a rollout is `digits / non-space characters` of its answers' text (0
for no text), a graded value in [0, 1]; with `turns` > 1 the env asks for more numbers after
each answer (also after one cut off by max_tokens) until the model has answered `turns` times.
Tasks are a pure function of (seed, split, index). Why a randomly initialised model can learn
it by RL alone: see the README.
"""

from __future__ import annotations

import random

from envrl.envs import Environment, Message, RolloutState, Rubric, Task

SYSTEM_PROMPT = "Continue the count. Answer with numbers only."


class CountTask(Task):
    prompt: str


def digit_fraction(completion: str) -> float:
    """Share of the answer's non-space characters that are ASCII digits (0 for an empty answer)."""
    chars = [c for c in completion if not c.isspace()]
    return sum(c in "0123456789" for c in chars) / len(chars) if chars else 0.0


def all_digit_fraction(messages: list[Message]) -> float:
    """`digit_fraction` over the text of all the model's answers together."""
    return digit_fraction(" ".join(m.get("content") or "" for m in messages if m.get("role") == "assistant"))


class CountOn(Environment):
    """The count goes on for `turns` answers: after each, the user asks for more numbers."""

    def __init__(self, turns: int, **kwargs: object) -> None:
        super().__init__(max_turns=turns, stop_on_length=False, **kwargs)  # type: ignore[arg-type]
        self.turns = turns

    async def env_response(self, state: RolloutState) -> list[Message]:
        if state.trace.num_turns >= self.turns:
            state.stop("completed")
            return []
        return [{"role": "user", "content": "More numbers."}]


def make_tasks(count: int, seed: int) -> list[CountTask]:
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        start = rng.randrange(0, 900)
        tasks.append(CountTask(idx=i, prompt=" ".join(str(n) for n in range(start, start + rng.randint(2, 5)))))
    return tasks


def load_environment(num_train: int = 256, num_eval: int = 32, seed: int = 0, turns: int = 1) -> Environment:
    tasks = {"tasks": lambda: make_tasks(num_train, seed), "eval_tasks": lambda: make_tasks(num_eval, seed + 1)}
    if turns == 1:
        return Environment(
            **tasks, rubric=Rubric({digit_fraction: 1.0}, share_process=True), system_prompt=SYSTEM_PROMPT
        )
    return CountOn(
        turns, **tasks, rubric=Rubric({all_digit_fraction: 1.0}, share_process=True), system_prompt=SYSTEM_PROMPT
    )
