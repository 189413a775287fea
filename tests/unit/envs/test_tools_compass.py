"""compass, the tool env of the SFT -> RL recipe: its reward pays for efficiency, and its
demonstrations are real rollouts in the `rl sft` format."""

import asyncio
import json
import random
from pathlib import Path

import pytest
from compass import DIRECTIONS, load_environment, make_tasks
from compass.demos import call, demonstration, solver_moves

from envrl.envs import SamplingArgs, ScriptedClient, ScriptedClientConfig
from envrl.model.chat_tokens import chat_renderer
from envrl.trainer.sft_data import load_demonstrations
from tests.unit.envs.helpers import TINY_CHAT


@pytest.mark.parametrize(("wrong_first", "reward"), [(0, 1.0), (1, 0.5), (2, 0.0)])
def test_the_reward_is_one_over_the_moves_once_arrived(wrong_first: int, reward: float) -> None:
    env = load_environment(num_train=4, max_turns=2)
    task = env.get_task("train", 0)
    wrong = [d for d in DIRECTIONS if d != task.direction]
    replies = [call(d) for d in wrong[:wrong_first]] + [call(task.direction)]
    client = ScriptedClient(ScriptedClientConfig(replies=replies))
    trace = asyncio.run(env.run_rollout(task, client, SamplingArgs(max_tokens=64)))
    assert trace.error is None and trace.reward == reward
    assert trace.metrics["valid_tool_call_share"] == 1.0


def test_demonstrations_are_rollouts_with_the_envs_own_error_replies_and_load_for_sft(tmp_path: Path) -> None:
    env = load_environment(num_train=1)
    rng = random.Random(0)
    tasks = make_tasks(32, 0)
    demos = [asyncio.run(demonstration(env, t, solver_moves(t, rng, wrong_share=0.5))) for t in tasks]
    for task, demo in zip(tasks, demos, strict=True):
        calls = [m for m in demo["messages"] if m["role"] == "assistant"]
        replies = [m["content"] for m in demo["messages"] if m["role"] == "tool"]
        assert json.loads(calls[-1]["tool_calls"][0]["function"]["arguments"]) == {"direction": task.direction}
        assert replies[-1] == "arrived" and all(r.startswith("Error: ValueError: blocked") for r in replies[:-1])
        assert [m["tool_call_id"] for m in demo["messages"] if m["role"] == "tool"] == [
            c["tool_calls"][0]["id"] for c in calls
        ]
    assert 8 <= sum(len(d["messages"]) == 5 for d in demos) <= 24  # about half start with a wrong move
    data = tmp_path / "demos.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in demos))
    samples, stats = load_demonstrations(data, chat_renderer(TINY_CHAT), seq_len=2048)
    assert len(samples) == 32 and stats.truncated == 0 and stats.dropped == 0
