"""Per-rollout overhead of the OpenEnv and TRL adapters over a native envrl env doing the same work.

All three envs ask for a count continued in digits and reward the digit share: `learnable` (native),
`trl-count` (TRL class + TRL reward functions) and `openenv-count` (an openenv-core server, served
from its own venv, that the env server starts as its child). Each runs in a real env server (one
static worker) with a scripted model (no vLLM: what is measured is the env side), as groups of 4:
first one group at a time (latency per rollout), then 16 groups in flight (throughput). Scoring
runs without a timeout, so no env pays for forking its reward functions (per-rollout rubrics fork
once per rollout, group rubrics once per group: a difference of the rubric kind, not the adapter).

    uv sync --project deps/envs/openenv-count --locked
    .venv/bin/python -m scripts.bench.adapters [--groups 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from statistics import median

from envrl.envclient.client import EnvClient
from envrl.runtime.process import spawn_sidecar

ROOT = Path(__file__).resolve().parents[2]
OPENENV_PYTHON = ROOT / "deps" / "envs" / "openenv-count" / ".venv" / "bin" / "python"
ENVS = {"learnable": ROOT / ".venv" / "bin" / "python", "trl-count": ROOT / ".venv" / "bin" / "python",
        "openenv-count": OPENENV_PYTHON}  # fmt: skip
ARGS = {"openenv-count": {"max_sessions": 8}}
"""One env worker holds all 8 sessions of the OpenEnv server: it queues its rollouts instead of polling."""
CLIENT = {"type": "scripted", "replies": ["12 13 14"]}
SAMPLING = {"max_tokens": 8}
GROUP = 4


async def measure(address: str, groups: int, in_flight: int) -> tuple[float, float]:
    """(median ms per rollout one group at a time, ms per rollout with `in_flight` groups at once)."""
    async with EnvClient(address) as client:

        async def group(i: int) -> float:
            start = time.perf_counter()
            traces = await client.run(i % 64, n=GROUP, sampling=SAMPLING)
            assert all(t.error is None for t in traces), [t.error for t in traces]
            return (time.perf_counter() - start) * 1000 / GROUP

        for i in range(5):  # warm-up: worker imports, first sessions
            await group(i)
        sequential = [await group(i) for i in range(groups)]
        start = time.perf_counter()
        semaphore = asyncio.Semaphore(in_flight)

        async def bounded(i: int) -> None:
            async with semaphore:
                await group(i)

        await asyncio.gather(*(bounded(i) for i in range(4 * groups)))
        concurrent = (time.perf_counter() - start) * 1000 / (4 * groups * GROUP)
    return median(sequential), concurrent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=16)
    args = parser.parse_args()
    results = {}
    for env_id, python in ENVS.items():
        argv = [str(python), "-m", "envrl.serve.main", "--env.id", env_id, "--address", "tcp://127.0.0.1:0",
                "--pool", '{"min_workers": 1, "max_workers": 1}', "--timeout.scoring_s", "null",
                "--env.args", json.dumps(ARGS.get(env_id, {})), "--client", json.dumps(CLIENT)]  # fmt: skip
        child, address = spawn_sidecar(argv, name=f"env server {env_id}", ready_timeout=300)
        try:
            results[env_id] = asyncio.run(measure(address, args.groups, args.in_flight))
        finally:
            child.stop(grace=10)
        print(f"{env_id:14s} {results[env_id][0]:7.2f} ms/rollout one group at a time, "
              f"{results[env_id][1]:6.2f} ms/rollout with {args.in_flight} groups in flight")  # fmt: skip
    base = results["learnable"]
    for env_id in ("trl-count", "openenv-count"):
        seq, conc = (a - b for a, b in zip(results[env_id], base, strict=True))
        print(f"overhead of {env_id}: {seq:+.2f} ms/rollout (one group at a time), {conc:+.2f} ms/rollout (in flight)")


if __name__ == "__main__":
    main()
