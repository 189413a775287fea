"""Per-rollout cost of where an env's programs run: an agent program or a verifiers harness in a
sandbox against the host, and verifiers' per-rollout MCP tool servers forked warm against fresh.

    uv run --no-sync python -m scripts.bench.sandboxed_rollouts --env agent-digits [--rollouts 8]
    deps/envs/verifiers-digits/.venv/bin/python -m scripts.bench.sandboxed_rollouts --env verifiers
    deps/envs/verifiers-digits/.venv/bin/python -m scripts.bench.sandboxed_rollouts --env verifiers-tools

The same task and the same scripted model (no model server: the time is the env's own) through
each placement: `host` (agent-digits: a fresh interpreter per rollout; verifiers: the harness
forked from a warm interpreter, the default), `sandbox` (one bubblewrap sandbox per rollout, the
program's imports inside it) and `sandbox+warm` (8 sandboxes started ahead by a `WarmPool`; for
verifiers each runs a warm server of the harness program inside, and the rollout's program is a
fork of it). `verifiers-tools` (digits-tools: a tool server per rollout, started by verifiers as
`python -m digits_tools.tools`): `warm` forks it from a warm interpreter of the module, `cold`
starts it fresh as verifiers does. One warm-up rollout (it builds the sandbox venv once per machine), then
`--rollouts` one after another (mean and median ms per rollout), then `--rollouts` at once (wall
time). Error rollouts are counted, never timed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from envrl.data.traces import Trace
from envrl.envs import Environment, SamplingArgs, ScriptedClientConfig, build_client, load_environment

PLACEMENTS: dict[str, dict[str, dict[str, Any]]] = {
    "agent-digits": {"host": {}, "sandbox": {"sandbox": {}}, "sandbox+warm": {"sandbox": {}, "warm": 8}},
    "verifiers": {
        "host": {},
        "sandbox": {"sandbox": {}, "warm": False},
        "sandbox+warm": {"sandbox": {}, "warm": 8},
    },
    "verifiers-tools": {"warm": {}, "cold": {"warm": False}},
}
TOKENIZER = "deps/models/tiny-chat"
"""The tiny model's tokenizer (a path: envrl.model.tiny imports torch, absent from the verifiers venv)."""
VERIFIERS = {"taskset": {"num_tasks": 64}, "agent": {"harness": {"id": "null"}}}


def environment(env: str, args: dict[str, Any]) -> Environment:
    if env == "verifiers":
        return load_environment("verifiers:digits-count", **VERIFIERS, **args)
    if env == "verifiers-tools":
        return load_environment("verifiers:digits-tools", **VERIFIERS, **args)
    return load_environment(env, **args)


async def measure(env_id: str, placement: str, args: dict[str, Any], n: int) -> str:
    env = environment(env_id, args)
    client = build_client(ScriptedClientConfig(replies=["12 34", "5678"], tokenizer=TOKENIZER))
    sampling = SamplingArgs(max_tokens=8)

    async def rollout(i: int) -> tuple[Trace, float]:
        start = time.perf_counter()
        trace = await env.run_rollout(env.get_task("train", i % 64), client, sampling, scoring_timeout=60)
        return trace, time.perf_counter() - start

    try:
        await rollout(0)
        sequential = [await rollout(i) for i in range(1, n + 1)]
        start = time.perf_counter()
        together = await asyncio.gather(*(rollout(i) for i in range(n + 1, 2 * n + 1)))
        wall = time.perf_counter() - start
    finally:
        if (aclose := getattr(env, "aclose", None)) is not None:
            await aclose()
    ok = [seconds * 1000 for trace, seconds in sequential if trace.error is None]
    errors = sum(trace.error is not None for trace, _ in [*sequential, *together])
    mean = statistics.mean(ok) if ok else float("nan")
    median = statistics.median(ok) if ok else float("nan")
    return f"| {env_id} | {placement} | {mean:8.0f} | {median:8.0f} | {wall:6.2f} | {errors} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=sorted(PLACEMENTS), default="agent-digits")
    parser.add_argument("--rollouts", type=int, default=8)
    args = parser.parse_args()
    print(f"| env | placement | ms/rollout, sequential (mean) | (median) | {args.rollouts} at once, wall s | errors |")
    print("|---|---|---:|---:|---:|---:|")
    for placement, env_args in PLACEMENTS[args.env].items():
        print(asyncio.run(measure(args.env, placement, env_args, args.rollouts)), flush=True)


if __name__ == "__main__":
    main()
