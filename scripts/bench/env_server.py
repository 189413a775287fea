"""Env server round-trip benchmark against a raw pyzmq DEALER/ROUTER msgpack echo (the physical floor).

Prints round-trips/s and p50/p99 latency at 16 and 1,024 requests in flight through `EnvClient`
-> `env-server` -> worker -> back, for the default (elastic) pool and a static 1-worker pool, then
the same figures for a raw echo of the same bytes, and the ratios, and the CPU time each process
(this client, the server, its workers; all threads) spent per round trip. Also the server's memory
(server + workers RSS) after an offered load of 4x (capacity + queue).

    .venv/bin/python scripts/bench/env_server.py [--seconds 4] [--pools elastic static] [--in-flight 16 1024] [--curve]

`--curve`: the env server and its clients use CURVE keys, as every env server `rl` starts does
(the run's keys, on loopback too); the echo reference stays plain.

This file is also the benchmark's environment (`env_server:load_environment`, imported by the
server's processes with this folder on PYTHONPATH): no model, constant reward, ~1 KB task.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TASK_BYTES = 1000
CURVE: Any = None
"""The clients' `CurveClientConfig` under `--curve` (None: plain TCP)."""

# ---------------------------------------------------------------------------------------------
# The environment (runs inside the server and its workers)


def load_environment(num_tasks: int = 64) -> Any:
    from envrl.data.traces import Task, Trace, WireTask
    from envrl.envs import Environment

    class PayloadTask(Task):
        payload: str

    class ConstantEnv(Environment):
        """Answers every rollout at once with reward 1: measures the serving path, nothing else."""

        def __init__(self) -> None:
            tasks = [PayloadTask(idx=i, payload="x" * TASK_BYTES) for i in range(num_tasks)]
            super().__init__(tasks=tasks)
            self.wire = [WireTask.model_validate(t.model_dump()) for t in tasks]

        async def run_group(
            self, task: Task, client: Any, sampling: Any, n: int, *, scoring_timeout: float | None = None
        ) -> list[Trace]:
            return [Trace(task=self.wire[task.idx], reward=1.0, stop_reason="completed")] * n

    return ConstantEnv()


# ---------------------------------------------------------------------------------------------
# Measurement


def summary(latencies: list[float], elapsed: float, cpu: dict[str, float]) -> dict[str, float]:
    """Throughput, latency percentiles and CPU µs per round trip of each process (`cpu`: seconds)."""
    ordered = sorted(latencies)
    return {
        "rps": len(ordered) / elapsed,
        "p50": ordered[len(ordered) // 2] * 1e3,
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
        **{f"us_{name}": seconds / len(ordered) * 1e6 for name, seconds in cpu.items()},
    }


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used between `start` and `stop` by this process (the client) and by `server` and its children."""

    def __init__(self, server: int) -> None:
        self.server = server

    def _read(self) -> dict[str, float]:
        workers = children(self.server)
        return {
            "client": time.process_time(),
            "server": cpu_seconds(self.server),
            "workers": sum(map(cpu_seconds, workers)),
        }

    def start(self) -> None:
        self.before = self._read()

    def stop(self) -> dict[str, float]:
        after = self._read()
        return {name: after[name] - self.before[name] for name in after}


async def measure_env_server(address: str, server_pid: int, in_flight: int, seconds: float) -> dict[str, float]:
    from envrl.envclient.client import EnvClient

    sampling = {"max_tokens": 1}
    latencies: list[float] = []
    async with EnvClient(address, timeout=60, curve=CURVE) as client:
        await client.wait_until_ready(60)
        stop_at = 0.0

        async def lane(i: int, record: bool) -> None:
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                await client.run(i % 64, sampling=sampling)
                if record:
                    latencies.append(time.perf_counter() - start)

        meter = CpuMeter(server_pid)
        for record, duration in ((False, 1.0), (True, seconds)):  # warm-up (elastic growth), then measure
            stop_at = time.perf_counter() + duration
            started = time.perf_counter()
            meter.start()
            await asyncio.gather(*(lane(i, record) for i in range(in_flight)))
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
    return summary(latencies, elapsed, cpu)


ECHO_SERVER = """
import sys, msgpack, zmq
sock = zmq.Context().socket(zmq.ROUTER)
sock.setsockopt(zmq.SNDHWM, 0)
port = sock.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
reply = msgpack.unpackb(bytes.fromhex(sys.argv[1]))
while True:
    identity, frame = sock.recv_multipart()
    request = msgpack.unpackb(frame)
    sock.send_multipart([identity, msgpack.packb({**reply, "id": request["id"]})])
"""


def measure_echo(
    address: str, server_pid: int, request: dict[str, Any], in_flight: int, seconds: float
) -> dict[str, float]:
    import msgpack
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sent: dict[str, float] = {}
    latencies: list[float] = []
    counter = 0
    meter = CpuMeter(server_pid)

    def send() -> None:
        nonlocal counter
        counter += 1
        rid = str(counter)
        sent[rid] = time.perf_counter()
        sock.send(msgpack.packb({**request, "id": rid}))

    for record, duration in ((False, 1.0), (True, seconds)):
        for _ in range(in_flight - len(sent)):
            send()
        started = time.perf_counter()
        stop_at = started + duration
        meter.start()
        while sent:
            response = msgpack.unpackb(sock.recv())
            latency = time.perf_counter() - sent.pop(response["id"])
            if record:
                latencies.append(latency)
            if time.perf_counter() < stop_at:
                send()
        elapsed = time.perf_counter() - started
    cpu = meter.stop()
    sock.close()
    return summary(latencies, elapsed, cpu)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its children, in MB."""
    total = 0.0
    pids = [pid, *children(pid)]
    for p in pids:
        with open(f"/proc/{p}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    return total


def overload(address: str, offered: int) -> tuple[int, int]:
    """Offer `offered` rollouts at once on a raw DEALER; return (answered ok, at_capacity)."""
    import msgpack
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)
    sock.setsockopt(zmq.LINGER, 0)
    if CURVE is not None:
        import zmq.auth

        sock.curve_serverkey = zmq.auth.load_certificate(CURVE.server_public_key_file)[0]
        sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(CURVE.secret_key_file)
    sock.connect(address)
    params = {"task_idx": 0, "sampling": {"max_tokens": 1}}
    for i in range(offered):
        sock.send(msgpack.packb({"id": str(i), "method": "run", "params": params}))
    answers = [msgpack.unpackb(sock.recv()) for _ in range(offered)]
    sock.close()
    return sum(a["ok"] for a in answers), sum(not a["ok"] and a["error"]["type"] == "at_capacity" for a in answers)


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per figure")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[16, 1024])
    parser.add_argument("--pools", nargs="+", choices=["elastic", "static"], default=["elastic", "static"])
    parser.add_argument("--curve", action="store_true", help="CURVE keys on server and clients, as under rl")
    args = parser.parse_args()

    import subprocess

    import msgpack

    from envrl.runtime.process import spawn_sidecar
    from envrl.serve import protocol as p

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    server_bin = str(Path(sys.executable).parent / "env-server")
    pools = {"elastic (default)": [], "static, 1 worker": ["--pool", '{"min_workers": 1, "max_workers": 1}']}
    pools = {name: argv for name, argv in pools.items() if name.split()[0].strip(",") in args.pools}
    curve_args: list[str] = []
    if args.curve:
        import atexit
        import shutil
        import tempfile

        from envrl.envclient.curve import curve_keys, make_curve_keys

        global CURVE
        keys = Path(tempfile.mkdtemp(prefix="envrl-bench-")) / "curve"
        atexit.register(shutil.rmtree, keys.parent, True)
        make_curve_keys(keys)
        server_keys, CURVE = curve_keys(keys)
        curve_args = ["--curve", server_keys.model_dump_json()]
    rows: list[tuple[str, int, dict[str, float]]] = []
    memory: list[str] = []
    for name, pool_args in pools.items():
        argv = [
            server_bin,
            "--env.id",
            "env_server:load_environment",
            "--address",
            "tcp://127.0.0.1:0",
            "--log.level",
            "WARNING",
            "--client",
            '{"type": "scripted"}',
            *pool_args,
            *curve_args,
        ]
        child, address = spawn_sidecar(argv, name="bench env-server", env=env, ready_timeout=120)
        try:
            for in_flight in args.in_flight:
                rows.append(
                    (
                        f"env-server, {name}",
                        in_flight,
                        asyncio.run(measure_env_server(address, child.pid, in_flight, args.seconds)),
                    )
                )
            info = asyncio.run(_info(address))
            offered = 4 * (info.capacity + info.max_queued)
            before = rss_mb(child.pid)
            accepted, refused = overload(address, offered)
            memory.append(
                f"{name}: offered {offered} at once (4 x (capacity {info.capacity} + queue {info.max_queued})): "
                f"{accepted} ok, {refused} at_capacity; server+workers RSS {before:.0f} MB -> {rss_mb(child.pid):.0f} MB"
            )
        finally:
            child.stop(grace=10)

    # The reference: the same request and response bytes through a bare ROUTER echo.
    trace = load_environment().wire[0]
    from envrl.data.traces import Trace

    reply = {"ok": True, "result": {"traces": [Trace(task=trace, reward=1.0, stop_reason="completed").to_wire()]}}
    request = {
        "method": "run",
        "params": {"task_idx": 0, "split": "train", "n": 1, "model": "0" * 16, "sampling": {"max_tokens": 1}},
    }
    echo = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, msgpack.packb(reply).hex()], stdout=subprocess.PIPE, text=True
    )
    try:
        echo_address = f"tcp://127.0.0.1:{echo.stdout.readline().strip()}"  # type: ignore[union-attr]
        echo_rows = {n: measure_echo(echo_address, echo.pid, request, n, args.seconds) for n in args.in_flight}
    finally:
        echo.kill()
        echo.wait()

    print(
        f"\nresponse frame {len(p.ok_response('x', p.RunResult.model_validate(reply['result'])))} bytes; {os.cpu_count()} CPUs; {args.seconds:g} s per figure\n"
    )
    print(
        f"{'path':38} {'in flight':>9} {'rt/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'rt/s vs echo':>13} {'p99 vs echo':>12}"
        f"   CPU us/rt: {'client':>6} {'server':>6} {'workers':>7}"
    )
    for name, n, r in [*rows, *(("raw pyzmq echo (reference)", n, r) for n, r in echo_rows.items())]:
        ref = echo_rows[n]
        print(
            f"{name:38} {n:>9} {r['rps']:>9.0f} {r['p50']:>8.2f} {r['p99']:>8.2f} {r['rps'] / ref['rps']:>12.0%} {r['p99'] / ref['p99']:>11.2f}x"
            f"              {r['us_client']:>6.1f} {r['us_server']:>6.1f} {r['us_workers']:>7.1f}"
        )
    print("\nmemory under overload:")
    for line in memory:
        print(f"  {line}")


async def _info(address: str) -> Any:
    from envrl.envclient.client import EnvClient

    async with EnvClient(address, curve=CURVE) as client:
        return await client.info()


if __name__ == "__main__":
    main()
