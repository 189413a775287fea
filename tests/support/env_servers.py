"""Real `env-server` processes for tests, on 127.0.0.1 port 0, that never outlive the test.

Guarantee: `running_env_server` yields a ready server (address from the sidecar pipe), serving
the model client it was started with (`--client`, default `SCRIPTED`), and on exit stops it and
SIGKILLs anything it started that is still alive, even when the test failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import zmq
from pydantic import BaseModel

from envrl.envclient.client import EnvClient
from envrl.runtime.process import Child, spawn_sidecar

HERE = Path(__file__).parent
ENV_SERVER = str(Path(sys.executable).parent / "env-server")
BAD_ENV = "bad_envs:load_environment"
SCRIPTED = {"type": "scripted", "replies": ["hi"]}
SAMPLING = {"max_tokens": 8}


@dataclass
class RunningServer:
    child: Child
    address: str
    log_file: Path
    seen_workers: set[int] = field(default_factory=set)

    def workers(self) -> list[int]:
        """Pids of the server's live worker processes (remembered for the final clean-up)."""
        pids = [pid for pid in children(self.child.pid) if alive(pid)]
        self.seen_workers.update(pids)
        return pids


def children(pid: int) -> list[int]:
    found: list[int] = []
    with suppress(FileNotFoundError, ProcessLookupError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    return found


def cmdline(pid: int) -> bytes:
    """The process's NUL-separated argv (empty once it is gone)."""
    with suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def alive(pid: int) -> bool:
    """True if `pid` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not true after {timeout:g} s")
        time.sleep(0.05)


def server_env() -> dict[str, str]:
    """The test process's environment, with bad_envs importable in the server and its workers."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}


def client_args(client: BaseModel | dict[str, Any] | None) -> list[str]:
    """The `--client` flag serving `client` (a ClientConfig or its map); none for None."""
    if client is None:
        return []
    return ["--client", client.model_dump_json() if isinstance(client, BaseModel) else json.dumps(client)]


@contextmanager
def running_env_server(
    tmp: Path,
    *args: str,
    env_id: str = BAD_ENV,
    client: BaseModel | dict[str, Any] | None = SCRIPTED,
    ready_timeout: float = 60.0,
    python: str | None = None,
) -> Iterator[RunningServer]:
    """`client`: the server's model client (None: a server that refuses `run`); `python`: the
    interpreter to serve in (an env's own venv); default: this test's `env-server`."""
    log = tmp / "env-server.log"
    command = [ENV_SERVER] if python is None else [python, "-m", "envrl.serve.main"]
    argv = [*command, "--env.id", env_id, "--address", "tcp://127.0.0.1:0", "--log.file", str(log)]
    argv += [*client_args(client), *args]
    child, address = spawn_sidecar(
        argv, name="env-server", log_file=tmp / "env-server.out", env=server_env(), ready_timeout=ready_timeout
    )
    server = RunningServer(child, address, log)
    try:
        yield server
    finally:
        server.workers()
        child.stop(grace=15.0)
        for pid in server.seen_workers:
            kill_worker(pid)


def kill_worker(pid: int) -> None:
    """SIGKILL `pid` if it is still an env worker (a recycled pid is left alone)."""
    with suppress(FileNotFoundError, ProcessLookupError), open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"envrl.serve.worker" in f.read():
            os.kill(pid, signal.SIGKILL)


def raw_exchange(address: str, messages: list[list[bytes]]) -> list[dict[str, Any]]:
    """Send raw multipart messages on a plain DEALER and return the decoded answers, in order."""
    context = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    dealer.connect(address)
    try:
        for frames in messages:
            dealer.send_multipart(frames)
        return [msgpack.unpackb(dealer.recv()) for _ in messages]
    finally:
        dealer.close()


def run(coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
    """Run one client coroutine to completion, failing the test instead of hanging past `timeout`."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def rollout(client: EnvClient, task_idx: int, **kwargs: Any) -> Any:
    """One rollout of task `task_idx` with the server's model client."""
    (trace,) = await client.run(task_idx, sampling=SAMPLING, **kwargs)
    return trace


def scripted_client(address: str, **kwargs: Any) -> EnvClient:
    """An `EnvClient` of the server at `address` (started with its default `SCRIPTED` client)."""
    return EnvClient(address, **kwargs)
