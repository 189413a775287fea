"""Offer an env server 4x its capacity from clients that read, plus one client that never reads.

Guarantee: `overload` returns an `OverloadRow` whose `lost` counts the rollouts sent by the reading
clients that got no answer at all (an answered `at_capacity` after the call's backoff is counted
apart, not as lost), and whose memory columns are the server's resident set sampled twice a
second, so a server that buffers answers for the silent client without bound shows it there.

    uv run --no-sync python -m scripts.chaos.overload [--seconds 60] [--workers 2] [--multiplex 4]

It starts `env-server --env.id reverse-text` (static pool, a small wait queue, a short client
stall timeout) on a free port. The silent client sends `info` requests as fast as the server takes
them and never reads an answer; the server must drop it (logged "does not read its answers")
rather than buffer its answers forever. tests/integration/test_chaos_overload.py runs it for a few
seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import msgpack
import zmq

from envrl.envclient.client import EnvClient, EnvServerError
from scripts.chaos.fuzz import SAMPLING, started_server
from tests.support.chaos_runs import TableRow, child_pids

DROPPED = "does not read its answers"
"""What the server logs when it drops a client whose answers pile up (serve/sender.py)."""


@dataclass
class OverloadRow(TableRow):
    seconds: float
    capacity: int
    """Rollouts the pool runs at once (workers x multiplex)."""
    offered: int
    """Rollout calls kept in flight by the reading clients (4 x capacity)."""
    sent: int
    answered: int
    """Calls answered with a Trace (scored or an error Trace)."""
    at_capacity: int
    """Calls whose `at_capacity` answers outlasted the client's backoff (an answer, not a loss)."""
    lost: int
    silent_requests: int
    """Requests sent by the client that never reads."""
    silent_drops: int
    """Times the server dropped that client (its log)."""
    rss_start_mib: float
    rss_peak_mib: float
    rss_end_mib: float
    """Resident memory of the server process (its workers apart)."""

    DIGITS = 1


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def silent_client(address: str, stop: threading.Event, sent: list[int]) -> None:
    """Send `info` requests until `stop`, never reading an answer."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.SNDTIMEO, 100)
    sock.connect(address)
    try:
        while not stop.is_set():
            try:
                sock.send(msgpack.packb({"id": f"silent-{sent[0]}", "method": "info", "params": {}}))
                sent[0] += 1
            except zmq.Again:  # our own send queue is full: the server is not taking more now
                continue
    finally:
        sock.close()


async def reading_clients(address: str, offered: int, seconds: float, counts: Counter[str]) -> None:
    """`offered` loops, each one rollout call after another, for `seconds`."""
    deadline = time.monotonic() + seconds
    async with EnvClient(address, timeout=30.0) as client:
        await client.wait_until_ready(60)

        async def loop(i: int) -> None:
            while time.monotonic() < deadline:
                counts["sent"] += 1
                try:
                    await client.run(i % 4, sampling=SAMPLING)
                    counts["answered"] += 1
                except EnvServerError as e:
                    counts["at_capacity" if e.type == "at_capacity" else f"error:{e.type}"] += 1

        await asyncio.gather(*(loop(i) for i in range(offered)))


def overload(seconds: float, workers: int, multiplex: int, stall_timeout: float = 2.0) -> OverloadRow:
    capacity = workers * multiplex
    with tempfile.TemporaryDirectory(prefix="envrl-overload-") as tmp:
        log = Path(tmp) / "env-server.log"
        args = [
            "--pool", f'{{"min_workers": {workers}, "max_workers": {workers}, "multiplex": {multiplex}}}',
            "--max-queued", str(capacity), "--client-send-queue", "4096",
            "--client-stall-timeout-s", str(stall_timeout), "--log.file", str(log),
        ]  # fmt: skip
        with started_server(*args, name="overloaded env-server") as (address, pid):
            rss = [rss_mib(pid)]
            stop, silent_sent = threading.Event(), [0]
            silent = threading.Thread(target=silent_client, args=(address, stop, silent_sent), daemon=True)
            silent.start()
            sampler_stop = threading.Event()

            def sample() -> None:
                while not sampler_stop.wait(0.5):
                    rss.append(rss_mib(pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            counts: Counter[str] = Counter()
            started = time.monotonic()
            try:
                asyncio.run(reading_clients(address, 4 * capacity, seconds, counts))
            finally:
                stop.set()
                silent.join()
                sampler_stop.set()
                sampler.join()
            elapsed = time.monotonic() - started
            rss.append(rss_mib(pid))
            assert child_pids(pid), "the server has no workers left"
            drops = log.read_text().count(DROPPED)
    errors = sum(v for k, v in counts.items() if k.startswith("error:"))
    return OverloadRow(
        seconds=elapsed, capacity=capacity, offered=4 * capacity, sent=counts["sent"],
        answered=counts["answered"] + errors, at_capacity=counts["at_capacity"],
        lost=counts["sent"] - counts["answered"] - errors - counts["at_capacity"],
        silent_requests=silent_sent[0], silent_drops=drops,
        rss_start_mib=rss[0], rss_peak_mib=max(rss), rss_end_mib=rss[-1],
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--multiplex", type=int, default=4)
    args = parser.parse_args()
    row = overload(args.seconds, args.workers, args.multiplex)
    print(OverloadRow.header())
    print(row.line(), flush=True)
    if row.lost or not row.silent_drops:
        raise SystemExit(f"FAILED: {row.lost} rollouts lost, silent client dropped {row.silent_drops} times")


if __name__ == "__main__":
    main()
