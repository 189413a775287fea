"""The example environments: rewards on right / wrong / malformed answers, full scripted rollouts."""

import asyncio
import json
import random
import re
from typing import Any

import pytest

from envrl.data.traces import Message, Trace
from envrl.envs import Environment, SamplingArgs, ScriptedClient, ScriptedClientConfig, load_environment
from envrl.model.chat_tokens import chat_renderer
from tests.support.tiny_chat import TINY_CHAT

SAMPLING = SamplingArgs(max_tokens=32)


def rollout(env: Environment, idx: int, replies: list[str] | None = None, respond: Any = None) -> Trace:
    client = ScriptedClient(ScriptedClientConfig(replies=replies or [], tokenizer=TINY_CHAT), respond=respond)
    return asyncio.run(env.run_rollout(env.get_task("train", idx), client, SAMPLING, scoring_timeout=10.0))


def group(env: Environment, idx: int, replies: list[str]) -> list[Trace]:
    client = ScriptedClient(ScriptedClientConfig(replies=replies, tokenizer=TINY_CHAT))
    return asyncio.run(env.run_group(env.get_task("train", idx), client, SAMPLING, len(replies), scoring_timeout=10.0))


def test_reverse_text_rewards_the_reversal_and_partial_overlap() -> None:
    env = load_environment("reverse-text")
    text = env.get_task("train", 3).text
    right, partial, wrong, empty = (
        rollout(env, 3, [r]).reward for r in (f" {text[::-1]}\n", text[::-1][: len(text) // 2], "0123", "")
    )
    assert right == 1.0 and 0.4 < partial < 1.0 and wrong == 0.0 and empty == 0.0
    assert rollout(env, 3, [text]).reward < 1.0  # not reversed


def test_reverse_text_tasks_are_reproducible_from_the_seed() -> None:
    a, b, c = (load_environment("reverse-text", seed=s) for s in (1, 1, 2))
    assert a.tasks == b.tasks != c.tasks and a.eval_tasks != a.tasks


def test_learnable_rewards_digits_gradually() -> None:
    env = load_environment("learnable")
    rewards = [rollout(env, 0, [r]).reward for r in ("101 102 103", "101 and 102", "one two", "")]
    assert rewards[0] == 1.0 and 0.3 < rewards[1] < 1.0 and rewards[2] == 0.0 and rewards[3] == 0.0


def test_learnable_reward_of_random_tokens_is_near_chance() -> None:
    """Uniformly random tokens score what the vocabulary's share of digit characters predicts."""
    renderer = chat_renderer(TINY_CHAT)
    reward = next(iter(load_environment("learnable").rubric.rewards))
    special = set(renderer.tokenizer.all_special_ids)
    vocab = [i for i in range(len(renderer.tokenizer)) if i not in special]
    pieces = [renderer.decode([i]) for i in vocab]
    chance = sum(sum(c.isdigit() for c in p) for p in pieces) / sum(sum(not c.isspace() for c in p) for p in pieces)
    rng = random.Random(0)
    scores = [reward(completion=renderer.decode(rng.choices(vocab, k=24))) for _ in range(400)]
    mean = sum(scores) / len(scores)
    assert abs(mean - chance) < 0.02
    assert mean < 0.15  # far below a learned 1.0: the smoke run has room to show learning


def test_guess_number_binary_search_solves_it_with_feedback() -> None:
    env = load_environment("guess-number")
    task = env.get_task("train", 5)
    bounds = [task.low, task.high]

    def binary_search(messages: list[Message]) -> str:
        feedback = messages[-1]["content"]
        if feedback == "Higher.":
            bounds[0] = int(messages[-2]["content"]) + 1
        elif feedback == "Lower.":
            bounds[1] = int(messages[-2]["content"]) - 1
        return str((bounds[0] + bounds[1]) // 2)

    trace = rollout(env, 5, respond=binary_search)
    guesses = trace.metrics["num_guesses"]
    assert trace.error is None and trace.stop_reason == "completed" and 1 <= guesses <= 7
    assert trace.reward == pytest.approx(max(0.5, 1.0 - 0.1 * (guesses - 1)) + 0.5)
    assert len(trace.branches) == 1 and trace.num_turns == guesses


def test_guess_number_gives_partial_credit_for_close_misses_and_none_for_non_numbers() -> None:
    env = load_environment("guess-number", max_turns=2)
    target = env.get_task("train", 0).target
    near, far = str(target + 1 if target < 100 else target - 1), str(1 if target > 50 else 100)
    near_trace, far_trace, junk = rollout(env, 0, [near]), rollout(env, 0, [far]), rollout(env, 0, ["no idea"])
    assert near_trace.stop_reason == "max_turns" and near_trace.metrics["solved"] == 0.0
    assert 0.49 < near_trace.reward < 0.5 and far_trace.reward < near_trace.reward
    assert junk.reward == 0.0 and junk.turns[1].prompt[-1]["content"].startswith("That is not a number")


def kv_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_kv_store_rewards_the_final_state_of_the_store() -> None:
    env = load_environment("kv-store")
    entries = env.get_task("train", 0).entries
    assert len(entries) >= 2
    (k1, v1), (k2, v2) = list(entries.items())[:2]
    complete = [kv_call("set", key=k, value=v) for k, v in entries.items()]
    trace = rollout(env, 0, ["".join(complete) + kv_call("finish")])
    assert trace.reward == 1.0 and trace.stop_reason == "tool_ended" and trace.metrics["extra_keys"] == 0.0
    half = rollout(env, 0, [kv_call("set", key=k1, value=v1), kv_call("set", key=k2, value="wrong"), kv_call("finish")])
    assert half.reward == pytest.approx(1 / len(entries)) and half.num_turns == 3
    overwritten = rollout(env, 0, ["".join(complete), kv_call("delete", key=k1), "I am done."])
    assert overwritten.reward == pytest.approx(1 - 1 / len(entries)) and overwritten.stop_reason == "completed"


def test_kv_store_malformed_calls_earn_nothing_and_are_explained() -> None:
    env = load_environment("kv-store", max_turns=3)
    key = next(iter(env.get_task("train", 0).entries))
    trace = rollout(env, 0, [kv_call("set", key=key, value=5), "<tool_call>{set}</tool_call>", "bye"])
    tool_messages = [m["content"] for m in trace.turns[-1].prompt if m["role"] == "tool"]
    assert re.match(r"Error: invalid arguments for set: value: Input should be a valid string", tool_messages[0])
    assert tool_messages[1].startswith("Error: the tool call is not valid JSON")
    assert trace.reward == 0.0 and trace.metrics["tool_errors"] == 2.0


def test_distinct_rank_is_group_scored_by_rank_within_the_group() -> None:
    env = load_environment("distinct-rank")
    assert env.group_scoring
    traces = group(env, 0, ["aaaa", "the quick brown fox", "abc", "cab"])
    assert [t.reward for t in traces] == [0.0, 1.0, 0.5, 0.5]
    assert [t.metrics["distinct_letters"] for t in traces] == [1.0, 15.0, 3.0, 3.0]
    assert rollout(env, 0, ["alone"]).reward == 0.5
