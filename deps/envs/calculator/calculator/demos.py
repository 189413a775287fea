"""Demonstrations of calculator for `rl sft`: rollouts of the env driven by a scripted solver that
calls `calculate` and answers with its result in a share of the episodes, and in the others
answers at once with a mental estimate (the product rounded to hundreds, almost always wrong).

    uv run --no-sync python -m calculator.demos --out outputs/calculator_demos.jsonl

Guarantee: every conversation is a real rollout of the env (the tool replies are the env's own),
the solver's calls are structured OpenAI `tool_calls` in the `rl sft` data format, and each
conversation's reward is what the env scored it. Since the estimates are demonstrated too, the
warm-started model answers without the tool in about that share of episodes: what is left for RL
is to learn that the tool is needed (the reward pays only the exact product).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path
from typing import Any

from calculator import ProductTask, load_environment, make_tasks
from envrl.envs import Message, SamplingArgs, ScriptedClient, ScriptedClientConfig, ToolEnvironment
from envrl.model.tool_calls import parse


def solver_replies(task: ProductTask, rng: random.Random, tool_share: float) -> list[str]:
    """The solver's turns: a `calculate` call then the product, or (1 - tool_share of the time)
    an estimate at once."""
    if rng.random() >= tool_share:
        return [f"{task.a} * {task.b} is about {round(task.a * task.b, -2)}."]
    call = {"name": "calculate", "arguments": {"expression": f"{task.a} * {task.b}"}}
    return [f"<tool_call>[{json.dumps(call)}]</tool_call>", f"{task.a} * {task.b} = {task.a * task.b}."]


async def demonstration(env: ToolEnvironment, task: ProductTask, replies: list[str]) -> dict[str, Any]:
    """The conversation of one rollout of `task` in which the model writes `replies`."""
    client = ScriptedClient(ScriptedClientConfig(replies=replies))
    trace = await env.run_rollout(task, client, SamplingArgs(max_tokens=64))
    if trace.error is not None or trace.num_turns != len(replies):
        raise RuntimeError(
            f"the scripted solver's rollout of task {task.idx} went wrong: {trace.error or trace.stop_reason}"
        )
    last = trace.turns[-1]
    messages: list[Message] = [*last.prompt, last.response]
    replies_ids = iter(m["tool_call_id"] for m in messages if m["role"] == "tool")
    structured = []
    for message in messages:
        if message["role"] == "assistant":
            message = parse(message["content"], "hermes")
            message["tool_calls"] = [{**c, "id": next(replies_ids)} for c in message.get("tool_calls", [])]
            if not message["tool_calls"]:
                del message["tool_calls"]
        structured.append(message)
    return {"messages": structured, "tools": env.schemas, "reward": trace.reward}


def write_demos(out: Path, count: int, tool_share: float, seed: int) -> list[dict[str, Any]]:
    """`count` demonstrations of the train tasks of `seed`, written to `out` as JSONL."""
    env = load_environment(num_train=1, num_eval=1, seed=seed)
    rng = random.Random(seed)

    async def conversations() -> list[dict[str, Any]]:
        return [await demonstration(env, t, solver_replies(t, rng, tool_share)) for t in make_tasks(count, seed)]

    demos = asyncio.run(conversations())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(d) + "\n" for d in demos))
    return demos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--count", type=int, default=128, help="conversations (tasks 0..count-1 of the train set)")
    parser.add_argument("--tool-share", type=float, default=0.5, help="share of episodes that call the tool")
    parser.add_argument("--seed", type=int, default=0, help="as the env's seed (same tasks as its train set)")
    args = parser.parse_args()
    demos = write_demos(args.out, args.count, args.tool_share, args.seed)
    solved = sum(d["reward"] for d in demos)
    print(f"wrote {len(demos)} demonstrations to {args.out} ({solved:.0f} of them answer the exact product)")


if __name__ == "__main__":
    main()
