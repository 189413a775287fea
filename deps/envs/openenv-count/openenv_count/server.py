"""The OpenEnv server: continue a count with numbers; each step is rewarded by its share of digits.

Guarantee: plain openenv-core (no envrl import): `reset(seed)` gives a count start that is a pure
function of the seed, each `step` rewards the message's share of non-space characters that are
digits (0 for an empty one), and the episode is done after `turns` steps.
"""

from __future__ import annotations

import random
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

MAX_CONCURRENT_ENVS = 8
"""Sessions the server holds at once; envrl queues rollouts beyond it."""


class CountAction(Action):
    message: str = Field(..., description="The model's answer")


class CountObservation(Observation):
    prompt: str = Field("", description="What the model is asked next")


def digit_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c in "0123456789" for c in chars) / len(chars) if chars else 0.0


class CountEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._turns = 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, turns: int = 1) -> CountObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._turns = turns
        rng = random.Random(seed)
        start = rng.randrange(0, 900)
        count = " ".join(str(n) for n in range(start, start + rng.randint(2, 5)))
        return CountObservation(prompt=count, done=False, reward=None)

    def step(self, action: CountAction) -> CountObservation:  # type: ignore[override]
        self._state.step_count += 1
        done = self._state.step_count >= self._turns
        return CountObservation(prompt="" if done else "More numbers.", done=done, reward=digit_share(action.message))

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    CountEnvironment, CountAction, CountObservation, env_name="count", max_concurrent_envs=MAX_CONCURRENT_ENVS
)
