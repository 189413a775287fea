"""Demonstrations of compass for `rl sft`: rollouts of the env driven by a scripted solver that,
in a share of the episodes, first calls `walk` (a tool compass does not have), reads the error
reply naming the tools, then calls `move` in the right direction.

    uv run --no-sync python -m compass.demos --out outputs/compass_demos.jsonl

Guarantee: every conversation is a real rollout of the env (its tool replies are the env's own),
with the solver's calls as structured OpenAI `tool_calls`, in the `rl sft` data format. Since the
wasted first calls are demonstrated too, the warm-started model still makes them: what is left
for RL is to stop (the reward pays 1 / turns).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path
from typing import Any

from compass import WalkTask, load_environment, make_tasks
from envrl.envs import Message, SamplingArgs, ScriptedClient, ScriptedClientConfig, ToolEnvironment
from envrl.model.tool_calls import parse

WRONG_TOOL = "walk"
"""The tool the solver calls first in a share of the episodes; compass has none of that name."""


def call(direction: str, tool: str = "move") -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': {'direction': direction}})}</tool_call>"


def solver_calls(task: WalkTask, rng: random.Random, wrong_share: float) -> list[str]:
    """The solver's calls: move in the right direction, after a call to `walk` (no such tool) in
    `wrong_share` of the episodes."""
    wrong = [call(task.direction, WRONG_TOOL)] if rng.random() < wrong_share else []
    return [*wrong, call(task.direction)]


async def demonstration(env: ToolEnvironment, task: WalkTask, calls: list[str]) -> dict[str, Any]:
    """The conversation of one rollout of `task` in which the model writes `calls`."""
    client = ScriptedClient(ScriptedClientConfig(replies=calls))
    trace = await env.rollout(task, client, SamplingArgs(max_tokens=64))
    if trace.error is not None or trace.stop_reason != "tool_ended":
        raise RuntimeError(f"the scripted solver did not finish task {task.idx}: {trace.error or trace.stop_reason}")
    last = trace.turns[-1]
    messages: list[Message] = [*last.prompt, last.response, *trace.trailing_messages]
    replies = iter(m["tool_call_id"] for m in messages if m["role"] == "tool")
    structured = []
    for message in messages:
        if message["role"] == "assistant":
            message = parse(message["content"], "hermes")
            message["tool_calls"] = [{**c, "id": next(replies)} for c in message["tool_calls"]]
        structured.append(message)
    return {"messages": structured, "tools": env.schemas}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--count", type=int, default=256, help="conversations (tasks 0..count-1 of the train set)")
    parser.add_argument(
        "--wrong-share", type=float, default=0.7, help="share of episodes that start with a call to `walk`"
    )
    parser.add_argument("--seed", type=int, default=0, help="as the env's seed (same tasks as its train set)")
    args = parser.parse_args()
    env = load_environment(num_train=1, num_eval=1, seed=args.seed)
    rng = random.Random(args.seed)

    async def write() -> None:
        with args.out.open("w") as f:
            for task in make_tasks(args.count, args.seed):
                calls = solver_calls(task, rng, args.wrong_share)
                f.write(json.dumps(await demonstration(env, task, calls)) + "\n")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(write())
    print(f"wrote {args.count} demonstrations to {args.out}")


if __name__ == "__main__":
    main()
