"""The per-rollout cost of the verifiers adapter: the same task and canned model, native vs verifiers.

    deps/envs/verifiers-digits/.venv/bin/python -m scripts.bench.verifiers_overhead [--rollouts 8] [--concurrency 8]

Both sides answer every model call with the same scripted client (tokens from the tiny model's
chat template, no model server), so the difference is what the adapter and verifiers add to one
rollout: verifiers' episode machinery, its null harness (a chat program run per rollout: forked
from a warm interpreter, `verifiers`, or started as a fresh interpreter, `verifiers-cold`, as
verifiers itself does), its interception server and envrl's chat proxy. It prints the mean sequential
rollout time of each and the wall time of `concurrency` rollouts at once. Runs in the example's
venv (verifiers is not installed in envrl's).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from statistics import fmean, median
from typing import Any

from envrl.data.traces import Task
from envrl.envs import Environment, Rubric, ScriptedClientConfig, load_environment
from envrl.model.client import ModelClient, ModelResponse, SamplingArgs, ScriptedClient

TINY_MODEL = "deps/models/tiny-chat"

SAMPLING = SamplingArgs(max_tokens=16)


class CountTask(Task):
    prompt: str


def digit_share(completion: str) -> float:
    chars = [c for c in completion if not c.isspace()]
    return sum(c in "0123456789" for c in chars) / len(chars) if chars else 0.0


class TimedClient(ScriptedClient):
    """The scripted client, noting when each call came (to split a rollout into before/after its call)."""

    def __init__(self) -> None:
        super().__init__(ScriptedClientConfig(replies=["415 416 417"], tokenizer=TINY_MODEL))
        self.called: list[float] = []

    async def generate(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.called.append(time.perf_counter())
        return await super().generate(*args, **kwargs)


def native() -> Environment:
    """The same task, written for envrl: one turn, digit share as the reward."""
    tasks = [CountTask(idx=0, prompt="412 413 414")]
    return Environment(tasks=tasks, rubric=Rubric({digit_share: 1.0}), system_prompt="Continue the count.")


async def sequential(env: Environment, client: TimedClient, n: int) -> tuple[list[float], list[float]]:
    """Each rollout's total time, and its time until the model call."""
    times, until_call = [], []
    for _ in range(n):
        start = time.perf_counter()
        trace = await env.run_rollout(env.get_task("train", 0), client, SAMPLING)
        times.append(time.perf_counter() - start)
        until_call.append(client.called[-1] - start)
        if trace.error is not None:
            raise RuntimeError(f"rollout failed: {trace.error.message}")
    return times, until_call


async def concurrent(env: Environment, client: ModelClient, n: int) -> float:
    start = time.perf_counter()
    traces = await env.run_group(env.get_task("train", 0), client, SAMPLING, n)
    if errors := [t.error.message for t in traces if t.error is not None]:
        raise RuntimeError(f"{len(errors)} rollouts failed: {errors[0]}")
    return time.perf_counter() - start


async def main(rollouts: int, concurrency: int) -> None:
    client = TimedClient()
    envs = {"native": native()}
    for name, warm in (("verifiers", True), ("verifiers-cold", False)):
        envs[name] = load_environment(
            "verifiers:digits-count", taskset={"num_tasks": 1}, agent={"harness": {"id": "null"}}, warm=warm
        )
    means = {}
    for name, env in envs.items():
        await sequential(env, client, 1)  # warm-up: tokenizer, verifiers' script env, proxy
        times, until_call = await sequential(env, client, rollouts)
        means[name] = fmean(times)
        wall = await concurrent(env, client, concurrency)
        print(
            f"{name:>14}: {means[name] * 1e3:8.1f} ms/rollout sequential (median {median(times) * 1e3:.1f}, min {min(times) * 1e3:.1f}, "
            f"max {max(times) * 1e3:.1f}; {fmean(until_call) * 1e3:.1f} ms of it before the model call); "
            f"{concurrency} at once: {wall:.2f} s wall ({wall / concurrency * 1e3:.0f} ms each)"
        )
        if hasattr(env, "aclose"):
            await env.aclose()
    for name in ("verifiers", "verifiers-cold"):
        print(f"{name} adapter overhead: {(means[name] - means['native']) * 1e3:.0f} ms per rollout (sequential)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.rollouts, args.concurrency))
