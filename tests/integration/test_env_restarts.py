"""A sidecar env server SIGKILLed mid-rollout is restarted on its address and the lost rollouts run again."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from envrl.envs.model_client import ScriptedClientConfig
from envrl.orchestrator.config import EnvConfig, SamplingConfig
from envrl.orchestrator.envs import Env, EnvUnavailable
from envrl.process import RestartPolicy
from envrl.serve.client import EnvClient
from envrl.serve.config import StaticPoolConfig

HERE = Path(__file__).parent
SLEEP_TASK = 1  # bad_envs: task 1 sleeps `sleep` seconds, then scores 1.0


@pytest.fixture(autouse=True)
def _bad_envs_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))


def sleeping_env(tmp_path: Path, restarts: RestartPolicy) -> Env:
    config = EnvConfig(
        id="bad_envs:load_environment", args={"sleep": 2.0}, pool=StaticPoolConfig(num_workers=1), restarts=restarts, reconnect_timeout=60
    )
    return Env(config, split="train", client=ScriptedClientConfig(replies=["hi"]), sampling=SamplingConfig(), log_dir=tmp_path, ready_timeout=120)


async def kill_server_once_running(env: Env) -> int:
    """SIGKILL the sidecar as soon as it reports a rollout in flight; return the pid killed."""
    async with EnvClient(env.address) as probe:
        while (await probe.info()).in_flight == 0:
            await asyncio.sleep(0.05)
    pid = env.server_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_sidecar_is_restarted_and_its_rollouts_rerun(tmp_path: Path) -> None:
    env = sleeping_env(tmp_path, RestartPolicy(max_restarts=1, backoff_s=0.1))

    async def run() -> tuple[list, int]:
        await env.start()
        try:
            group = asyncio.create_task(env.run_group(SLEEP_TASK, n=2, seed=0))
            killed = await kill_server_once_running(env)
            return await group, killed
        finally:
            await env.shutdown()

    traces, killed = asyncio.run(run())
    assert [t.reward for t in traces] == [1.0, 1.0] and not any(t.has_error for t in traces)
    assert env.counters["retried_rollouts"] == 2
    assert env.counters["env_server_restarts"] == 1 and env.counters["env_server_losses"] == 1
    assert killed != env.server_pid


def test_a_sidecar_out_of_restarts_fails_naming_the_server(tmp_path: Path) -> None:
    env = sleeping_env(tmp_path, RestartPolicy(max_restarts=0))

    async def run() -> None:
        await env.start()
        try:
            group = asyncio.create_task(env.run_group(SLEEP_TASK, n=1, seed=0))
            await kill_server_once_running(env)
            await group
        finally:
            await env.shutdown()

    with pytest.raises(EnvUnavailable, match=r"train env server 'bad_envs:load_environment'.*SIGKILL.*giving up"):
        asyncio.run(run())
