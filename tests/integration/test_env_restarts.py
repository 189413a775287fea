"""A dead env server is restarted on its address by the one `Supervisor` (the orchestrator's and
`rl eval`'s `Sidecars` for the servers they spawn, the launcher for the servers it runs) and the
rollouts lost with it run again."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from envrl.envclient.client import EnvClient
from envrl.envclient.config import EnvConfig
from envrl.envclient.handles import EnvHandle, EnvUnavailable
from envrl.envclient.sidecars import Sidecars
from envrl.model.client import SamplingParams, ScriptedClientConfig
from envrl.runtime.process import ChildFailed, config_argv, spawn_sidecar
from envrl.runtime.restarts import RestartPolicy
from envrl.runtime.supervisor import Respawn, Supervisor
from envrl.serve.config import EnvServerConfig, EnvSpec, PoolConfig
from tests.support.ports import free_port

HERE = Path(__file__).parents[1] / "support"  # the helper envs loaded by bare module name
SLEEP_TASK = 1  # bad_envs: task 1 sleeps `sleep` seconds, then scores 1.0
TITLE = "train env server 'bad_envs:load_environment'"


@pytest.fixture(autouse=True)
def _bad_envs_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))


def sleeping_env(tmp_path: Path, restarts: RestartPolicy) -> EnvHandle:
    config = EnvConfig(
        id="bad_envs:load_environment",
        args={"sleep": 2.0},
        pool=PoolConfig(min_workers=1, max_workers=1),
    )
    return EnvHandle(
        config,
        split="train",
        client=ScriptedClientConfig(replies=["hi"]),
        sampling=SamplingParams(),
        ready_timeout=120,
        sidecars=Sidecars(tmp_path, restarts, ready_timeout=120),
    )


async def stop(env: EnvHandle) -> None:
    await env.shutdown()
    assert env.sidecars is not None
    await env.sidecars.close()


def server_pid(env: EnvHandle) -> int | None:
    assert env.sidecars is not None
    return env.sidecars.pid(env.address)


async def kill_server_once_running(env: EnvHandle) -> int:
    """SIGKILL the sidecar as soon as it reports a rollout in flight; return the pid killed."""
    async with EnvClient(env.address, curve=env.config.curve) as probe:  # a sidecar answers only its key's holder
        while (await probe.info()).in_flight == 0:
            await asyncio.sleep(0.05)
    pid = server_pid(env)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_sidecar_is_restarted_and_its_rollouts_rerun(tmp_path: Path) -> None:
    env = sleeping_env(tmp_path, RestartPolicy(max_restarts=1, backoff_s=0.1))

    async def run() -> tuple[list, int, int | None]:
        await env.start()
        try:
            group = asyncio.create_task(env.run_group(SLEEP_TASK, n=2, seed=0))
            killed = await kill_server_once_running(env)
            return await group, killed, server_pid(env)
        finally:
            await stop(env)

    traces, killed, restarted = asyncio.run(run())
    assert [t.reward for t in traces] == [1.0, 1.0] and not any(t.has_error for t in traces)
    assert env.counters["retried_rollouts"] == 2
    assert env.counters["env_server_restarts"] == 1 and env.counters["env_server_losses"] == 1
    assert restarted is not None and killed != restarted
    assert env.sidecars is not None  # watched by rl's Supervisor: the death and its recovery are on its record
    [fault] = env.sidecars.supervisor.recoveries()[TITLE]["faults"]
    assert fault["exit"] == "was killed by SIGKILL" and fault["back"]


def test_a_sidecar_out_of_restarts_fails_naming_the_server(tmp_path: Path) -> None:
    env = sleeping_env(tmp_path, RestartPolicy(max_restarts=0))

    async def run() -> None:
        await env.start()
        try:
            group = asyncio.create_task(env.run_group(SLEEP_TASK, n=1, seed=0))
            await kill_server_once_running(env)
            await group
        finally:
            await stop(env)

    with pytest.raises(EnvUnavailable, match=r"train env server 'bad_envs:load_environment'.*SIGKILL.*giving up"):
        asyncio.run(run())


async def take_port_once_free(port: int) -> socket.socket:
    """Listen on `port` as soon as the killed server's sockets are gone (well before its restart binds)."""
    for _ in range(500):
        try:
            return socket.create_server(("127.0.0.1", port))
        except OSError:
            await asyncio.sleep(0.01)
    raise RuntimeError(f"port {port} never came free")


def test_a_sidecar_restart_that_cannot_start_uses_a_restart_and_the_next_one_succeeds(tmp_path: Path) -> None:
    """The port is taken by another process when the first restart binds; freed for the second."""
    env = sleeping_env(tmp_path, RestartPolicy(max_restarts=2, backoff_s=0.2))

    async def run() -> list:
        await env.start()
        try:
            port = int(env.address.rsplit(":", 1)[1])
            group = asyncio.create_task(env.run_group(SLEEP_TASK, n=1, seed=0))
            await kill_server_once_running(env)
            squatter = await take_port_once_free(port)
            try:
                restarts = env.sidecars.supervisor.restarts  # type: ignore[union-attr]
                while restarts().get(TITLE, 0) < 2 and not group.done():  # the first restart fails on the taken port
                    await asyncio.sleep(0.02)
            finally:
                squatter.close()
            return await group
        finally:
            await stop(env)

    traces = asyncio.run(run())
    assert [t.reward for t in traces] == [1.0]
    assert env.counters["env_server_restarts"] == 1


def test_the_launcher_restarts_a_dead_env_server_on_its_address_until_its_budget_is_spent(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    server = EnvServerConfig(
        env=EnvSpec(id="bad_envs:load_environment"), address=address, pool=PoolConfig(min_workers=1, max_workers=1)
    )
    argv = [sys.executable, "-m", "envrl.serve.main", *config_argv(server)]
    start = partial(spawn_sidecar, argv, name="train env server 'bad'", log_file=tmp_path / "bad.log")
    supervisor = Supervisor(grace=5.0)
    supervisor.add(start()[0], Respawn(lambda: start()[0], RestartPolicy(max_restarts=1, backoff_s=0.1)))
    answered: list[int] = []

    def kill_twice() -> None:
        first = supervisor.children[0].pid
        os.kill(first, signal.SIGKILL)
        while supervisor.children[0].pid == first:
            time.sleep(0.05)

        async def workers() -> int:
            async with EnvClient(address) as client:
                return (await client.wait_until_ready(60)).workers

        answered.append(asyncio.run(workers()))  # the restarted server, on the same address
        os.kill(supervisor.children[0].pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_twice)
    killer.start()
    try:
        with pytest.raises(ChildFailed, match=r"train env server 'bad'.*SIGKILL.*restarts.max_restarts = 1"):
            supervisor.watch(until={"trainer"})
    finally:
        killer.join()
        supervisor.stop_all()
    assert answered == [1] and supervisor.restarts() == {"train env server 'bad'": 1}
