"""compass: walk in the direction the user names by calling the `move` tool.

Guarantee: the one tool is a method of a plain class (one instance per rollout); a move in the
named direction ends the episode, any other direction is refused with an error reply the model
can act on, and so is a call to a tool that does not exist. The reward reads only the rollout:
1 / (model turns) once arrived, else 0, so the right call on the first turn earns most and every
wasted turn costs.

Why it suits the tiny random model better than kv-store: the answer is one of four words picked
by one word of the prompt (a mapping from a small fixed set, not a copy of an arbitrary string),
wrapped in a fixed tool-call syntax that `rl sft` on `compass.demos` teaches; what RL learns from
there (docs/agents.md) is to stop wasting the first turn the way the demonstrations do.
"""

from __future__ import annotations

import random

from envrl.envs import Rubric, Task, ToolEnvironment, Trace

DIRECTIONS = ("left", "right")


class WalkTask(Task):
    prompt: str
    direction: str


class Walker:
    """The tools the model sees. `done` ends the episode."""

    def __init__(self) -> None:
        self.goal = ""
        self.done = False

    def reset(self, prompt: str, direction: str) -> None:
        self.goal, self.done = direction, False

    def move(self, direction: str) -> str:
        """Take one step.

        Args:
            direction: where to go.
        """
        if direction not in DIRECTIONS:
            raise ValueError(f"unknown direction {direction!r}; use left or right")
        if direction != self.goal:
            raise ValueError(f"blocked: a wall is {direction}")
        self.done = True
        return "arrived"


def arrived(env: Walker, trace: Trace) -> float:
    """1 / model turns once the walker arrived (1.0 for the right call on the first turn), 0 otherwise."""
    return 1.0 / trace.num_turns if env.done else 0.0


def make_tasks(count: int, seed: int) -> list[WalkTask]:
    """ "Go <direction>." with a direction drawn per task; one verb, so the direction word always
    sits at the same place in the prompt (the tiny model finds it by position)."""
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        direction = rng.choice(DIRECTIONS)
        tasks.append(WalkTask(idx=i, prompt=f"Go {direction}.", direction=direction))
    return tasks


def load_environment(num_train: int = 256, num_eval: int = 32, seed: int = 0, max_turns: int = 4) -> ToolEnvironment:
    return ToolEnvironment(
        tool_class=Walker,
        tasks=lambda: make_tasks(num_train, seed),
        eval_tasks=lambda: make_tasks(num_eval, seed + 1),
        rubric=Rubric({arrived: 1.0}),
        max_turns=max_turns,
    )
