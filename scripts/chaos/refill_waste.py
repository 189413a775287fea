"""Chaos: env workers SIGKILLed under load; how many rollouts run per useful sample, with and
without refills of single failed rollouts.

    flock /tmp/envrl-heavy.lock uv run --no-sync python -m scripts.chaos.refill_waste \
        [--steps 12] [--interval 1.0] [--max-reruns 0] [--rounds 2]

A real env server (tests/support/outcome_env.py: each rollout sleeps `--sleep` s and appends a
line to a marker file, so every run counts, re-runs inside the server included) with
`--workers` workers; the orchestrator's scheduler keeps `--inflight` rollouts in flight in groups
of `--group`, and a killer SIGKILLs a random worker every `--interval` s. Each round runs the
same seeded schedule twice, interleaved: refills off (`refill_rollouts = 0`: envrl before issue
39, a failed rollout only leaves its group's baseline) and on (`--refill` per step).

Printed per mode (medians over rounds): infra failures per rollout, rollouts run per useful
sample (useful: a rollout in the baseline of a batched group, at least 2 of them), useful samples
per step of `--batch` (a batch short of useful samples trains less), and, from the refills-off
runs, what dropping every group with a failure and generating it again (what other frameworks
do) would cost: rollouts run per useful sample when only groups without a failure count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from envrl.envclient.config import DeclaredEnvConfig
from envrl.envclient.handles import EnvHandle, TrainEnvs
from envrl.model.client import SamplingParams, ScriptedClientConfig
from envrl.orchestrator.advantage import baseline
from envrl.orchestrator.scheduler import BatchShape, Scheduler
from tests.support.env_servers import RunningServer, running_env_server


@dataclass
class Tally:
    runs: int = 0
    """Rollouts started in a worker (the marker file's lines): first runs, server re-runs, refills."""
    rollouts: int = 0
    """Rollouts batched (the refilled ones once) and their failed attempts."""
    infra: int = 0
    useful: int = 0
    clean_group_rollouts: int = 0
    """Rollouts of batched groups with no failed rollout (what a drop-the-group policy trains)."""
    kills: int = 0
    steps: int = 0


async def kill_workers(server: RunningServer, interval: float, rng: random.Random, tally: Tally) -> None:
    while True:
        await asyncio.sleep(interval)
        workers = server.workers()
        if workers:
            os.kill(rng.choice(sorted(workers)), signal.SIGKILL)
            tally.kills += 1


async def run_mode(server: RunningServer, marker: Path, args: argparse.Namespace, refill: int, seed: int) -> Tally:
    config = DeclaredEnvConfig(id="outcome", address=server.address, max_retries=args.max_retries)
    env = EnvHandle(
        config,
        split="train",
        client=ScriptedClientConfig(replies=["hi"]),
        sampling=SamplingParams(),
        ready_timeout=120,
    )
    shape = BatchShape(
        group_size=args.group, batch_size=args.batch, max_inflight=args.inflight, max_async_level=1000,
        max_steps=args.steps,
    )  # fmt: skip
    scheduler = Scheduler(TrainEnvs([env], seed=seed), shape, seed=seed, counters=Counter(), refill_rollouts=refill)
    tally = Tally()
    before = len(marker.read_text().splitlines()) if marker.exists() else 0
    await env.start()
    killer = asyncio.create_task(kill_workers(server, args.interval, random.Random(seed), tally))
    try:
        for step in range(args.steps):
            for group in await scheduler.collect(step, policy=step):
                every = group.all_traces
                tally.rollouts += len(every)
                tally.infra += sum(t.outcome == "infra_error" for t in every)
                tally.useful += len(baseline(group.traces))
                if not any(t.has_error for t in every):
                    tally.clean_group_rollouts += len(group.traces)
            tally.steps += 1
    finally:
        killer.cancel()
        await scheduler.close()
        await env.shutdown()
    tally.runs = len(marker.read_text().splitlines()) - before
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds each rollout takes")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between worker SIGKILLs")
    parser.add_argument("--max-reruns", type=int, default=0, help="the env server's re-runs of a dead worker's rollout")
    parser.add_argument("--max-retries", type=int, default=0, help="the env's max_retries (orchestrator re-runs)")
    parser.add_argument("--refill", type=int, default=8, help="refill_rollouts of the refills-on runs")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="refill-waste-"))
    marker = tmp / "runs"
    env_args = {"marker_dir": str(tmp), "sleep_s": args.sleep}
    pool = {"min_workers": args.workers, "max_workers": args.workers}
    argv = ["--pool", json.dumps(pool), "--max-reruns", str(args.max_reruns), "--env.args", json.dumps(env_args)]
    results: dict[int, list[Tally]] = {0: [], args.refill: []}
    with running_env_server(tmp, *argv, env_id="outcome_env:load_environment", ready_timeout=120) as server:
        for round_ in range(args.rounds):
            for refill in (0, args.refill):  # interleaved: A, B, A, B
                tally = asyncio.run(run_mode(server, marker, args, refill, seed=round_))
                results[refill].append(tally)
                print(f"round {round_} refill {refill}: {tally}", flush=True)

    def med(tallies: list[Tally], f) -> float:
        return median(f(t) for t in tallies)

    print(
        f"\n{args.steps} steps of {args.batch} rollouts (groups of {args.group}, {args.inflight} in flight, "
        f"{args.workers} workers, {args.sleep:g} s per rollout), a worker SIGKILLed every {args.interval:g} s; "
        f"env server max_reruns {args.max_reruns}, env max_retries {args.max_retries}; medians of {args.rounds} rounds"
    )
    print("| policy | infra failures per rollout | rollouts run per useful sample | useful samples per step |")
    print("|---|---|---|---|")
    off = results[0]
    rows = [
        ("drop every group with a failure (regenerate it)", off, lambda t: t.runs / max(t.clean_group_rollouts, 1),
         lambda t: t.clean_group_rollouts / t.steps),
        ("envrl before: failed rollouts leave the baseline (refill 0)", off, lambda t: t.runs / max(t.useful, 1),
         lambda t: t.useful / t.steps),
        (f"envrl after: + refill of single rollouts (refill {args.refill})", results[args.refill],
         lambda t: t.runs / max(t.useful, 1), lambda t: t.useful / t.steps),
    ]  # fmt: skip
    for name, tallies, per_useful, per_step in rows:
        failures = med(tallies, lambda t: t.infra / max(t.rollouts, 1))
        print(f"| {name} | {failures:.3f} | {med(tallies, per_useful):.3f} | {med(tallies, per_step):.1f} |")


if __name__ == "__main__":
    main()
