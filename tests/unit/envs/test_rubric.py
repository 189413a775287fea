"""Rubrics: weighted rewards by parameter name, metrics, group scoring, and a real scoring deadline."""

import asyncio
import os
import time
from pathlib import Path

import pytest

from envrl.data.traces import Task, Trace
from envrl.envs import Environment, Rubric, SamplingArgs, ScriptedClient, ScriptedClientConfig

SAMPLING = SamplingArgs(max_tokens=8)


class WordTask(Task):
    prompt: str
    word: str


def env_with(rubric: Rubric) -> Environment:
    return Environment(tasks=[WordTask(idx=0, prompt="say cat", word="cat")], rubric=rubric)


def run_one(rubric: Rubric, reply: str = "cat", timeout: float | None = None) -> Trace:
    env = env_with(rubric)
    client = ScriptedClient(ScriptedClientConfig(replies=[reply]))
    return asyncio.run(env.run_rollout(env.get_task("train", 0), client, SAMPLING, scoring_timeout=timeout))


def exact(completion: str, word: str) -> float:
    return float(completion == word)


def length(completion: str) -> float:
    return float(len(completion))


def test_reward_is_the_weighted_sum_and_zero_weight_functions_are_metrics() -> None:
    async def sees_everything(task, trace, state, messages, prompt, env, word) -> float:
        assert isinstance(task, WordTask) and isinstance(trace, Trace) and env is None
        assert prompt == [{"role": "user", "content": "say cat"}] and messages[-1]["content"] == state.completion
        return 0.25 if word == "cat" else 0.0

    trace = run_one(Rubric({exact: 2.0, length: 0.0, sees_everything: 4.0}))
    assert trace.error is None
    assert trace.reward == 2.0 * 1.0 + 4.0 * 0.25
    assert trace.metrics == {"exact": 1.0, "length": 3.0, "sees_everything": 0.25}
    assert trace.timing.scoring is not None


def not_for_cats(word: str) -> float | None:
    return None if word == "cat" else 1.0


def test_a_function_returning_none_is_left_out_of_the_weighted_mean() -> None:
    trace = run_one(Rubric({exact: 1.0, not_for_cats: 3.0, length: 0.0}), reply="dog")
    # exact 0.0 (w 1) and length (metric) apply, not_for_cats does not: mean over the applicable
    # weighted ones is 0.0, scaled back to the rubric's total weight 4
    assert trace.error is None and trace.reward == 0.0
    assert trace.metrics == {"exact": 0.0, "length": 3.0}
    trace = run_one(Rubric({exact: 1.0, not_for_cats: 3.0}), reply="cat")
    assert trace.reward == 4.0 * 1.0 and "not_for_cats" not in trace.metrics


def test_a_rollout_no_weighted_function_applies_to_is_an_error() -> None:
    trace = run_one(Rubric({not_for_cats: 1.0, length: 0.0}))
    assert trace.reward is None and trace.error.type == "no_reward"
    assert "not_for_cats" in trace.error.message


def test_group_functions_may_skip_single_rollouts() -> None:
    def first_only(completions: list[str]) -> list[float | None]:
        return [1.0] + [None] * (len(completions) - 1)

    env = env_with(Rubric({exact: 1.0}, group={first_only: 1.0}))
    client = ScriptedClient(ScriptedClientConfig(replies=["cat"]))
    traces = asyncio.run(env.run_group(env.get_task("train", 0), client, SAMPLING, 3))
    assert [t.reward for t in traces] == [2.0, 2.0, 2.0]
    assert [("first_only" in t.metrics) for t in traces] == [True, False, False]


def test_asking_for_an_unknown_argument_is_an_error_trace_naming_the_choices() -> None:
    def wants_gold(gold: str) -> float:
        return 1.0

    trace = run_one(Rubric({wants_gold: 1.0}))
    assert trace.reward is None and trace.error.type == "reward_error"
    assert "'gold'" in trace.error.message and "completion" in trace.error.message and "word" in trace.error.message


@pytest.mark.parametrize("timeout", [None, 5.0], ids=["in-thread", "forked"])
def test_a_raising_reward_function_becomes_an_error_trace(timeout: float | None) -> None:
    def broken(completion: str) -> float:
        raise ZeroDivisionError("no reward today")

    trace = run_one(Rubric({exact: 1.0, broken: 1.0}), timeout=timeout)
    assert trace.reward is None and trace.stop_reason == "error"
    assert (
        trace.error.type == "reward_error"
        and "broken" in trace.error.message
        and "no reward today" in trace.error.message
    )
    assert "ZeroDivisionError" in trace.error.traceback


def test_non_finite_or_non_numeric_rewards_are_errors() -> None:
    def nan_reward() -> float:
        return float("nan")

    def text_reward() -> str:
        return "good"

    assert "finite float" in run_one(Rubric({nan_reward: 1.0})).error.message
    assert "finite float" in run_one(Rubric({text_reward: 1.0})).error.message


def test_cpu_bound_reward_function_is_stopped_at_the_scoring_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    def spins_forever(completion: str) -> float:
        pid_file.write_text(str(os.getpid()))
        while True:
            pass

    trace = run_one(Rubric({spins_forever: 1.0}), timeout=1.0)
    assert trace.reward is None and trace.error.type == "scoring_timeout" and "1.0s" in trace.error.message
    child = int(pid_file.read_text())
    assert child != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # killed and reaped, not left spinning


def test_async_reward_function_is_stopped_at_the_scoring_timeout() -> None:
    async def waits_forever() -> float:
        await asyncio.Event().wait()
        return 1.0

    trace = run_one(Rubric({exact: 1.0, waits_forever: 1.0}), timeout=0.2)
    assert trace.reward is None and trace.error.type == "scoring_timeout"


def test_waiting_for_a_scoring_slot_does_not_count_against_the_timeout() -> None:
    """8x more scorings than slots: the last wave waits ~7 runs (7 s), longer than the timeout (4 s),
    while each run (1 s) keeps 3 s of slack for a loaded machine."""

    def takes_a_while() -> float:
        time.sleep(1.0)
        return 1.0

    env = env_with(Rubric({takes_a_while: 1.0}))
    client = ScriptedClient(ScriptedClientConfig(replies=["x"]))
    n = 8 * (os.cpu_count() or 1)
    traces = asyncio.run(env.run_group(env.get_task("train", 0), client, SAMPLING, n, scoring_timeout=4.0))
    assert [t.error for t in traces] == [None] * n and [t.reward for t in traces] == [1.0] * n


def test_group_functions_score_all_rollouts_of_a_task_together() -> None:
    def longest_wins(completions: list[str], traces: list[Trace], word: str) -> list[float]:
        assert len(traces) == len(completions) and word == "cat"
        best = max(map(len, completions))
        return [float(len(c) == best) for c in completions]

    env = env_with(Rubric({length: 0.0}, group={longest_wins: 1.0}))
    assert env.group_scoring
    client = ScriptedClient(ScriptedClientConfig(replies=["a", "abc", "ab"]))
    traces = asyncio.run(env.run_group(env.get_task("train", 0), client, SAMPLING, 3, scoring_timeout=5.0))
    assert [t.reward for t in traces] == [0.0, 1.0, 0.0]
    assert [t.metrics for t in traces][1] == {"length": 3.0, "longest_wins": 1.0}


def test_a_group_function_returning_the_wrong_number_of_values_fails_the_group() -> None:
    def one_value(completions: list[str]) -> list[float]:
        return [1.0]

    env = env_with(Rubric(group={one_value: 1.0}))
    client = ScriptedClient(ScriptedClientConfig(replies=["a", "b"]))
    traces = asyncio.run(env.run_group(env.get_task("train", 0), client, SAMPLING, 2))
    assert all(t.reward is None and "one value per rollout" in t.error.message for t in traces)


def test_without_group_functions_the_env_is_not_group_scored() -> None:
    assert not env_with(Rubric({exact: 1.0})).group_scoring


def test_metric_names_must_be_unique() -> None:
    def exact_again(completion: str) -> float:
        return 0.0

    exact_again.__name__ = "exact"
    with pytest.raises(ValueError, match="unique"):
        Rubric({exact: 1.0, exact_again: 1.0})
