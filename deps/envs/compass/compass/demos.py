"""Demonstrations of compass for `rl sft`: rollouts of the env driven by a scripted solver that
first moves in a wrong direction in a share of the episodes (and gets the env's error reply),
then in the right one.

    uv run --no-sync python -m compass.demos --out outputs/compass_demos.jsonl

Guarantee: every conversation is a real rollout of the env (its tool replies are the env's own),
with the solver's calls as structured OpenAI `tool_calls`, in the `rl sft` data format. Since
the wrong first moves are demonstrated too, the warm-started model still makes them: what is
left for RL is to stop (the reward pays 1 / moves).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path
from typing import Any

from compass import DIRECTIONS, WalkTask, load_environment, make_tasks
from envrl.data.traces import Message
from envrl.envs import SamplingArgs, ScriptedClient, ScriptedClientConfig, ToolEnvironment
from envrl.model.tool_calls import parse


def call(direction: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'move', 'arguments': {'direction': direction}})}</tool_call>"


def solver_moves(task: WalkTask, rng: random.Random, wrong_share: float) -> list[str]:
    """The solver's moves: the right direction, after a random wrong one in `wrong_share` of episodes."""
    wrong = [rng.choice([d for d in DIRECTIONS if d != task.direction])] if rng.random() < wrong_share else []
    return [*wrong, task.direction]


async def demonstration(env: ToolEnvironment, task: WalkTask, moves: list[str]) -> dict[str, Any]:
    """The conversation of one rollout of `task` in which the model makes `moves`."""
    client = ScriptedClient(ScriptedClientConfig(replies=[call(d) for d in moves]))
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
    parser.add_argument("--wrong-share", type=float, default=0.5, help="share of episodes that start with a wrong move")
    parser.add_argument("--seed", type=int, default=0, help="as the env's seed (same tasks as its train set)")
    args = parser.parse_args()
    env = load_environment(num_train=1, num_eval=1, seed=args.seed)
    rng = random.Random(args.seed)

    async def write() -> None:
        with args.out.open("w") as f:
            for task in make_tasks(args.count, args.seed):
                moves = solver_moves(task, rng, args.wrong_share)
                f.write(json.dumps(await demonstration(env, task, moves)) + "\n")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(write())
    print(f"wrote {args.count} demonstrations to {args.out}")


if __name__ == "__main__":
    main()
