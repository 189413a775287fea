"""Scoring cost per rollout in an env worker: the `learnable` env, `n` rollouts finishing together.

    uv run --no-sync python -m scripts.bench.scoring [--rollouts 64] [--rounds 5]

Each round runs `rollouts` concurrent `run_rollout`s of deps/envs/learnable against a scripted
model (no inference: what is left is the env's own work, scoring first) with the worker's default
scoring timeout, so sync reward functions run in forked children (src/envrl/runtime/forked.py).
Prints the median wall time per round and the CPU time per rollout of this process and of its
children (the forks), which is what the env worker takes from inference and training on a shared box.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path
from statistics import median

from envrl.envs import SamplingArgs, ScriptedClient, ScriptedClientConfig
from envrl.serve.config import EnvTimeoutConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deps/envs/learnable"))
import learnable  # noqa: E402 - the example env lives outside the package


def cpu_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


async def one_round(rollouts: int) -> float:
    env = learnable.load_environment()
    client = ScriptedClient(ScriptedClientConfig(replies=["12 13 14 x"]))
    sampling, timeout = SamplingArgs(max_tokens=32), EnvTimeoutConfig().scoring_s
    start = time.perf_counter()
    traces = await asyncio.gather(
        *(env.run_rollout(env.get_task("train", i), client, sampling, scoring_timeout=timeout) for i in range(rollouts))
    )
    assert all(t.reward is not None for t in traces), [t.error for t in traces if t.error]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    own0, children0 = cpu_s()
    walls = [asyncio.run(one_round(args.rollouts)) for _ in range(args.rounds)]
    own1, children1 = cpu_s()
    n = args.rollouts * args.rounds
    print(f"{args.rollouts} rollouts x {args.rounds} rounds: median wall {median(walls):.3f} s/round")
    print(
        f"CPU per rollout: env process {(own1 - own0) / n * 1e3:.2f} ms, forked children {(children1 - children0) / n * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
