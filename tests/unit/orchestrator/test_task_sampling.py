"""TrainEnvs: env choice follows the ratios; tasks are a seeded shuffle, each once per epoch; evals follow their schedule."""

import random
from collections import Counter

from envrl.envclient.config import DeclaredEnvConfig
from envrl.envclient.handles import EnvHandle, TrainEnvs
from envrl.model.client import SamplingParams, ScriptedClientConfig
from envrl.orchestrator.config import TrainEvalsConfig


def make_env(name: str, num_tasks: int, ratio: float | None = None) -> EnvHandle[DeclaredEnvConfig]:
    env = EnvHandle(
        DeclaredEnvConfig(id="x", name=name, ratio=ratio),
        split="train",
        client=ScriptedClientConfig(),
        sampling=SamplingParams(),
        ready_timeout=1.0,
    )
    env.num_tasks = num_tasks
    return env


def test_env_choice_follows_configured_ratios() -> None:
    envs = TrainEnvs([make_env("a", 10, ratio=3.0), make_env("b", 1000, ratio=1.0)], seed=0)
    rng = random.Random(0)
    counts = Counter(envs.pick(rng).name for _ in range(20_000))
    assert abs(counts["a"] / 20_000 - 0.75) < 0.015


def test_without_ratios_env_choice_is_proportional_to_task_count() -> None:
    envs = TrainEnvs([make_env("a", 100), make_env("b", 300)], seed=0)
    assert envs.shares() == {"a": 0.25, "b": 0.75}


def test_every_task_once_per_epoch_in_a_seeded_order() -> None:
    env = make_env("a", 50)
    envs = TrainEnvs([env], seed=1)
    first_epoch = [envs.next_task(env) for _ in range(50)]
    second_epoch = [envs.next_task(env) for _ in range(50)]
    assert sorted(first_epoch) == list(range(50)) == sorted(second_epoch)
    assert first_epoch != second_epoch != list(range(50))
    again = TrainEnvs([make_env("a", 50)], seed=1)
    assert [again.next_task(again.envs[0]) for _ in range(50)] == first_epoch


def test_sampling_resumes_from_saved_positions() -> None:
    env = make_env("a", 20)
    envs = TrainEnvs([env], seed=3)
    drawn = [envs.next_task(env) for _ in range(30)]
    resumed = TrainEnvs([make_env("a", 20)], seed=3)
    resumed.positions.update({"a": 25})
    assert [resumed.next_task(resumed.envs[0]) for _ in range(5)] == drawn[25:]


def test_evals_are_due_on_their_interval_and_at_start_if_asked() -> None:
    every_two = TrainEvalsConfig(interval=2, at_start=True)
    every_three = TrainEvalsConfig(interval=3)
    assert [step for step in range(7) if every_two.due(step)] == [0, 2, 4, 6]
    assert [step for step in range(7) if every_three.due(step)] == [3, 6]
