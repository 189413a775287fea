"""compass, the tool env of the SFT -> RL recipe: its reward pays for efficiency (1 / turns, a
call to a tool that does not exist costs a turn and is not a valid call), and its demonstrations
are real rollouts in the `rl sft` format."""

import asyncio
import json
import random
from pathlib import Path

import pytest
from compass import DIRECTIONS, load_environment, make_tasks
from compass.demos import WRONG_TOOL, call, demonstration, solver_calls

from envrl.envs import SamplingArgs, ScriptedClient, ScriptedClientConfig
from envrl.model.chat_tokens import chat_renderer
from envrl.trainer.sft.data import load_demonstrations
from tests.support.tiny_chat import TINY_CHAT


@pytest.mark.parametrize(
    ("first", "reward", "valid_share"),
    [([], 1.0, 1.0), (["wrong direction"], 0.5, 1.0), ([WRONG_TOOL], 0.5, 0.5), (["wrong direction"] * 2, 0.0, 1.0)],
)
def test_the_reward_is_one_over_the_turns_once_arrived(first: list[str], reward: float, valid_share: float) -> None:
    env = load_environment(num_train=4, max_turns=2)
    task = env.get_task("train", 0)
    wrong = next(d for d in DIRECTIONS if d != task.direction)
    before = [call(task.direction, WRONG_TOOL) if f == WRONG_TOOL else call(wrong) for f in first]
    client = ScriptedClient(ScriptedClientConfig(replies=[*before, call(task.direction)]))
    trace = asyncio.run(env.run_rollout(task, client, SamplingArgs(max_tokens=64)))
    assert trace.error is None and trace.reward == reward
    assert trace.metrics["valid_tool_call_share"] == valid_share


def test_demonstrations_are_rollouts_with_the_envs_own_error_replies_and_load_for_sft(tmp_path: Path) -> None:
    env = load_environment(num_train=1)
    rng = random.Random(0)
    tasks = make_tasks(32, 0)
    demos = [asyncio.run(demonstration(env, t, solver_calls(t, rng, wrong_share=0.5))) for t in tasks]
    for task, demo in zip(tasks, demos, strict=True):
        calls = [m for m in demo["messages"] if m["role"] == "assistant"]
        replies = [m["content"] for m in demo["messages"] if m["role"] == "tool"]
        assert json.loads(calls[-1]["tool_calls"][0]["function"]["arguments"]) == {"direction": task.direction}
        assert replies[-1] == "arrived" and all(r.startswith("Error: there is no tool 'walk'") for r in replies[:-1])
        assert [m["tool_call_id"] for m in demo["messages"] if m["role"] == "tool"] == [
            c["tool_calls"][0]["id"] for c in calls
        ]
    assert 8 <= sum(len(d["messages"]) == 5 for d in demos) <= 24  # about half start with a call to walk
    data = tmp_path / "demos.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in demos))
    samples, stats = load_demonstrations(data, chat_renderer(TINY_CHAT), seq_len=2048)
    assert len(samples) == 32 and stats.truncated == 0 and stats.dropped == 0
