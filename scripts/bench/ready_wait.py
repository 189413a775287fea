"""How late the readiness waits notice a server that comes up: `rl`'s (`wait_until_serving`) and
the orchestrator's (`InferenceClient.wait_until_ready`, which step 0 waits on).

    uv run --no-sync python -m scripts.bench.ready_wait [--trials 10]

A loopback `/health` server starts listening 2-4 s (random, seeded) after each wait begins, as
vLLM's socket does once it has loaded; each line prints the mean and max lag from that moment to
the wait's return, and the waiting process's CPU time, for the code's poll schedule
(`poll_delays`) and for a fixed cadence (what each wait did before: 1 s and 0.5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

from envrl.inference import launch as inference_launch
from envrl.model import inference as model_inference
from envrl.runtime.http import poll_delays
from tests.support.ports import free_port


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Alive:
    """A child that never exits (the wait under test polls it)."""

    def poll(self) -> None:
        return None


def serve_later(port: int, delay: float) -> tuple[threading.Event, list[float], list[HTTPServer]]:
    """Start listening on `port` after `delay` s; the moment and the server come back in the lists."""
    done, up, servers = threading.Event(), [], []

    def run() -> None:
        time.sleep(delay)
        server = HTTPServer(("127.0.0.1", port), Health)
        up.append(time.monotonic())
        servers.append(server)
        done.set()
        server.serve_forever()

    threading.Thread(target=run, daemon=True).start()
    return done, up, servers


def launcher_wait(url: str) -> None:
    inference_launch.wait_until_serving(Alive(), url, timeout=30.0)  # type: ignore[arg-type]


def orchestrator_wait(url: str) -> None:
    async def wait() -> None:
        client = model_inference.InferenceClient(url, "m")
        try:
            await client.wait_until_ready(30.0)
        finally:
            await client.aclose()

    asyncio.run(wait())


def trial(wait: Callable[[str], None], rng: random.Random) -> tuple[float, float]:
    port = free_port()
    done, up, servers = serve_later(port, rng.uniform(2.0, 4.0))
    cpu = time.process_time()
    wait(f"http://127.0.0.1:{port}")
    lag, cpu = time.monotonic() - up[0], time.process_time() - cpu
    servers[0].shutdown()
    return lag, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    trials = parser.parse_args().trials
    fixed: Callable[[float], Callable[..., Iterator[float]]] = lambda s: lambda **_: itertools.repeat(s)  # noqa: E731
    cases = [
        ("rl's wait_until_serving", launcher_wait, inference_launch, fixed(1.0), "fixed 1 s"),
        ("orchestrator's wait_until_ready", orchestrator_wait, model_inference, fixed(0.5), "fixed 0.5 s"),
    ]
    for name, wait, module, before, before_name in cases:
        for label, schedule in (("poll_delays", poll_delays), (before_name, before)):
            module.poll_delays = schedule  # type: ignore[attr-defined]
            rng = random.Random(0)
            results = [trial(wait, rng) for _ in range(trials)]
            lags = [lag for lag, _ in results]
            print(
                f"{name:32s} {label:12s} lag mean {statistics.mean(lags):.3f} s, max {max(lags):.3f} s; "
                f"CPU {statistics.mean(cpu for _, cpu in results) * 1000:.0f} ms per wait"
            )
        module.poll_delays = poll_delays  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
