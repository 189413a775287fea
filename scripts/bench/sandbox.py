"""Sandbox start-up and tool-call throughput of the local bubblewrap backend, by concurrency.

    uv run --no-sync python -m scripts.bench.sandbox [--concurrency 1 16 64 256] [--calls 20] [--command python] [--warm]

For each concurrency c: start c sandboxes at once (each start timed from the `create` call until
its agent answers: time to interactive; in rounds until 32 starts were timed), then each runs `--calls` tool calls back to back, all c
at once (a tool call: `python3 -c 'print(1)'`, what `run_python` costs, or `--command echo`
for the sandbox's own overhead: `echo 1` through the shell), then all close. Prints start-up
p50/p99, tool calls per second over all sandboxes, and call latency p50/p99. Counts error-free
calls only and says how many failed. `--warm`: each round's c sandboxes come from a `WarmPool`
already holding c (start-up is then the hand-out).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from envrl.sandbox import BubblewrapProvider, Sandbox, SandboxConfig, SandboxProvider, WarmPool

MIN_STARTS = 32
"""Starts timed at least, in rounds of `concurrency` (the last round's sandboxes run the calls)."""
COMMANDS = {"python": ["python3", "-c", "print(1)"], "echo": "echo 1"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed_start(provider: BubblewrapProvider, config: SandboxConfig) -> tuple[Sandbox, float]:
    start = time.perf_counter()
    box = await provider.create(config)
    return box, time.perf_counter() - start


async def calls(box: Sandbox, n: int, command: str | list[str]) -> list[float]:
    latencies = []
    for _ in range(n):
        start = time.perf_counter()
        result = await box.run(command)
        if result.exit_code == 0 and result.stdout == "1\n":
            latencies.append(time.perf_counter() - start)
    return latencies


async def filled(pool: WarmPool) -> WarmPool:
    """`pool` once it holds `size` started sandboxes."""
    await (await pool.create(pool.config)).close()  # the first create starts the fill
    while len(pool._ready) < pool.size:
        await asyncio.sleep(0.01)
    return pool


async def one(concurrency: int, n_calls: int, command: str | list[str], warm: bool) -> str:
    config = SandboxConfig(episode_s=600, start_timeout_s=300)
    provider: SandboxProvider = BubblewrapProvider()
    starts: list[float] = []
    for _ in range(-(-MIN_STARTS // concurrency)):  # enough rounds for a p99 at low concurrency
        if warm:
            provider = await filled(WarmPool(BubblewrapProvider(), config, size=concurrency))
        started = await asyncio.gather(*(timed_start(provider, config) for _ in range(concurrency)))
        boxes = [b for b, _ in started]
        starts += [s for _, s in started]
        if len(starts) < MIN_STARTS:
            await asyncio.gather(*(box.close() for box in boxes))
        await provider.aclose()
    begin = time.perf_counter()
    per_box = await asyncio.gather(*(calls(box, n_calls, command) for box in boxes))
    wall = time.perf_counter() - begin
    await asyncio.gather(*(box.close() for box in boxes))
    latencies = [x for box in per_box for x in box]
    failed = concurrency * n_calls - len(latencies)
    return (
        f"| {concurrency:>4} | {percentile(starts, 0.5) * 1000:7.1f} | {percentile(starts, 0.99) * 1000:7.1f} "
        f"| {len(latencies) / wall:8.1f} | {percentile(latencies, 0.5) * 1000:7.1f} | {percentile(latencies, 0.99) * 1000:7.1f} "
        f"| {failed:>6} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--calls", type=int, default=20, help="tool calls per sandbox")
    parser.add_argument("--command", choices=sorted(COMMANDS), default="python")
    parser.add_argument("--warm", action="store_true", help="time hand-outs from a full WarmPool of c sandboxes")
    args = parser.parse_args()
    start = "warm-pool hand-out" if args.warm else "cold start"
    print(f"{os.cpu_count()} CPUs; {start}; tool call = {COMMANDS[args.command]!r}; {args.calls} calls per sandbox")
    print("| conc | start p50 ms | start p99 ms | calls/s | call p50 ms | call p99 ms | failed |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for concurrency in args.concurrency:
        print(asyncio.run(one(concurrency, args.calls, COMMANDS[args.command], args.warm)), flush=True)


if __name__ == "__main__":
    main()
