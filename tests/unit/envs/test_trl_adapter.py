"""TRL environment_factory classes and reward functions run under envrl with TRL 1.16's calling convention."""

import asyncio
import json
from typing import Any

import pytest

from envrl.data.traces import Trace
from envrl.envs import SamplingArgs, ScriptedClient, ScriptedClientConfig
from envrl.envs.adapters.trl import TrlEnvironment
from tests.support.tiny_chat import TINY_CHAT

ROWS = [
    {"prompt": [{"role": "user", "content": "Guess the number."}], "secret": 7, "hint": "odd"},
    {"prompt": "Guess again.", "secret": 4, "hint": None},
]


class Guess:
    """A TRL-style class: reset gets the row and returns an observation; get_reward owns a reward."""

    def reset(self, **row: Any) -> str:
        self.row = row
        self.secret = row["secret"]
        self.guesses: list[int] = []
        return " Numbers are 1..9."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The guess.
        """
        self.guesses.append(number)
        return "right" if number == self.secret else "wrong"

    def get_reward(self) -> float:
        return float(self.secret in self.guesses)


seen: list[dict[str, Any]] = []


def recorded(prompts: list, completions: list, completion_ids: list, environments: list, **kwargs: Any) -> list[float]:
    seen.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **kwargs})
    kwargs["log_metric"]("ignored", 1.0)  # TRL's logging hooks are callable
    return [float(len(env.guesses)) for env in environments]


def only_with_hint(completions: list, hint: list, **kwargs: Any) -> list[float | None]:
    return [None if h is None else 0.5 for h in hint]


def call(number: int) -> str:
    return f"<tool_call>{json.dumps({'name': 'guess', 'arguments': {'number': number}})}</tool_call>"


def run_group(env: TrlEnvironment, idx: int, guess: int, scoring_timeout: float | None = None) -> list[Trace]:
    """Two rollouts that each guess `guess` twice (max_turns 2). Without a scoring timeout, reward
    functions run in this process (with one, in a forked child), so `recorded` can record."""
    client = ScriptedClient(ScriptedClientConfig(replies=[call(guess)], tokenizer=TINY_CHAT))
    task = env.get_task("train", idx)
    return asyncio.run(env.run_group(task, client, SamplingArgs(max_tokens=32), 2, scoring_timeout=scoring_timeout))


def make_env(**kwargs: Any) -> TrlEnvironment:
    return TrlEnvironment(
        dataset=ROWS, environment_factory=Guess, reward_funcs=[recorded, only_with_hint], max_turns=2, **kwargs
    )


def test_public_methods_but_reset_and_get_reward_are_the_tools() -> None:
    assert [s["function"]["name"] for s in make_env().schemas] == ["guess"]


def test_reset_gets_the_row_and_its_string_is_appended_to_the_last_prompt_message() -> None:
    seen.clear()
    [trace, _] = run_group(make_env(), 0, 7)
    assert trace.error is None, trace.error
    assert trace.turns[0].prompt[-1]["content"] == "Guess the number. Numbers are 1..9."
    [batch] = seen
    assert batch["prompts"][0][-1]["content"] == "Guess the number. Numbers are 1..9."


def test_reward_functions_get_the_group_batched_the_way_trl_passes_a_batch() -> None:
    seen.clear()
    traces = run_group(make_env(), 0, 7)
    [batch] = seen
    assert batch["secret"] == [7, 7] and batch["hint"] == ["odd", "odd"]  # dataset columns, one per rollout
    assert "prompt" not in batch and batch["trainer_state"] is None
    first = batch["completions"][0]
    assert [m["role"] for m in first] == ["assistant", "tool"] * 2 and first[1]["content"] == "right"
    assert batch["completion_ids"][0] == [i for t in traces[0].turns for i in t.tokens.completion_ids]
    for trace in traces:  # recorded: 2 guesses; only_with_hint: 0.5; Guess.get_reward: 1 (found it)
        assert trace.metrics["recorded"] == 2.0 and trace.metrics["only_with_hint"] == 0.5
        assert trace.metrics["Guess"] == 1.0 and trace.reward == pytest.approx(3.5)


def test_none_means_not_applicable_and_weights_are_trls_reward_weights() -> None:
    env = make_env(reward_weights=[2.0, 1.0])
    [trace, _] = run_group(env, 1, 3, scoring_timeout=5.0)  # sync functions in a forked child, as in a server
    assert trace.error is None, trace.error
    assert "only_with_hint" not in trace.metrics  # None: not applicable to this row
    # (recorded 2 * 2 + Guess 0 * 1) scaled by total weight 4 / applicable weight 3 (envrl's Rubric)
    assert trace.reward == pytest.approx(4.0 * 4 / 3)


def test_a_class_without_reset_is_refused_and_a_reward_source_is_required() -> None:
    with pytest.raises(TypeError, match="must define reset"):
        TrlEnvironment(dataset=ROWS, environment_factory=object, reward_funcs=[recorded])

    class NoReward:
        def reset(self, **row: Any) -> None:
            pass

        def act(self) -> str:
            """Act."""
            return ""

    with pytest.raises(ValueError, match="no reward source"):
        TrlEnvironment(dataset=ROWS, environment_factory=NoReward)


def test_the_trl_count_example_rewards_the_digit_share_and_logs_the_none_able_metric() -> None:
    from envrl.envs import load_environment

    env = load_environment("trl-count", num_train=4)
    client = ScriptedClient(ScriptedClientConfig(replies=["1 2 a"], tokenizer=TINY_CHAT))
    odd, even = (
        asyncio.run(env.run_group(env.get_task("train", i), client, SamplingArgs(max_tokens=8), 2, scoring_timeout=5.0))
        for i in (1, 2)
    )
    assert [t.reward for t in odd + even] == [pytest.approx(2 / 3)] * 4  # continues_count has weight 0
    assert "continues_count" in odd[0].metrics and "continues_count" not in even[0].metrics
