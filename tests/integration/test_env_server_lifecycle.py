"""EnvHandle server start-up, shutdown, security and scaling, each with its own real server process."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envrl.envclient.client import EnvServerError
from envrl.envclient.config import EnvConfig
from envrl.envclient.handles import EnvClientMismatch, EnvHandle
from envrl.model.client import SamplingParams, ScriptedClientConfig, TrainClientConfig
from envrl.runtime.process import ChildFailed, begin_sidecar, spawn_sidecar
from tests.support.bad_envs import OK, SLEEP
from tests.support.curve_keys import make_curve_keys
from tests.support.env_servers import (
    ENV_SERVER,
    SCRIPTED,
    alive,
    rollout,
    run,
    running_env_server,
    scripted_client,
    server_env,
    wait_until,
)


def test_sigterm_drains_in_flight_rollouts_then_exits_0_quietly(tmp_path: Path) -> None:
    with running_env_server(
        tmp_path, "--pool", '{"min_workers": 1, "max_workers": 1}', "--env.args", '{"sleep": 1.0}'
    ) as server:
        workers = server.workers()

        async def go() -> None:
            async with scripted_client(server.address) as client:
                pending = [asyncio.ensure_future(rollout(client, SLEEP)) for _ in range(3)]
                await asyncio.sleep(0.3)
                server.child.popen.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                with pytest.raises(EnvServerError) as refused:
                    await rollout(client, OK)
                assert refused.value.type == "shutting_down"
                assert [t.reward for t in await asyncio.gather(*pending)] == [1.0, 1.0, 1.0]

        run(go())
        assert server.child.wait(15) == 0
        output = (tmp_path / "env-server.out").read_text()
        assert "Traceback" not in output and "SIGTERM: draining 3 requests" in output
        assert not any(alive(pid) for pid in workers)


def test_a_taken_port_is_one_clear_error_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    with running_env_server(tmp_path) as server:
        second = subprocess.run(
            [ENV_SERVER, "--env.id", "reverse-text", "--address", server.address],
            capture_output=True, text=True, timeout=60, env=server_env(),
        )  # fmt: skip
    assert second.returncode != 0
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0] and server.address in lines[0], second.stderr


def test_a_sidecar_that_dies_before_ready_is_named_with_its_log_tail(tmp_path: Path) -> None:
    argv = [ENV_SERVER, "--env.id", "no-such-env", "--address", "tcp://127.0.0.1:0"]
    with pytest.raises(ChildFailed) as failed:
        spawn_sidecar(
            argv, name="env-server no-such-env", log_file=tmp_path / "out.log", env=server_env(), ready_timeout=60
        )
    message = str(failed.value)
    assert "env-server no-such-env" in message and "exited with code 2 before reporting ready" in message
    assert "no environment 'no-such-env' is installed" in message


def test_a_sidecar_that_never_reports_is_killed_at_its_ready_timeout(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; print('working on it', flush=True); time.sleep(60)"]
    with pytest.raises(ChildFailed) as failed:
        spawn_sidecar(argv, name="silent child", log_file=tmp_path / "out.log", ready_timeout=1.0)
    assert "did not report ready within 1 s" in str(failed.value) and "working on it" in str(failed.value)


def _waits_for(mine: Path, theirs: Path) -> list[str]:
    """A sidecar that marks `mine`, then reports ready only once `theirs` exists: two of them get
    ready only if they run at once (begun one after the other's ready, the first never would)."""
    code = (
        "import pathlib, time; from envrl.runtime.process import report_ready\n"
        f"pathlib.Path({str(mine)!r}).touch()\n"
        f"while not pathlib.Path({str(theirs)!r}).exists(): time.sleep(0.05)\n"
        "report_ready('ok'); time.sleep(60)"
    )
    return [sys.executable, "-c", code]


def test_sidecars_begun_together_load_at_once_and_an_abandoned_one_is_stopped(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    begun = []
    try:
        for name, argv in (
            ("first", _waits_for(a, b)),
            ("second", _waits_for(b, a)),
            ("third", _waits_for(tmp_path / "c", tmp_path / "never")),
        ):
            begun.append(begin_sidecar(argv, name=name, log_file=tmp_path / f"{name}.log", ready_timeout=60))
        first, second, third = begun
        assert (first.ready(), second.ready()) == ("ok", "ok")
        third.abandon()
        assert third.child.poll() is not None
    finally:
        for sidecar in begun:
            sidecar.child.stop(grace=1.0)


def test_a_non_loopback_address_without_curve_keys_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [ENV_SERVER, "--env.id", "reverse-text", "--address", "tcp://0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "reachable from other hosts" in result.stderr and "--insecure" in result.stderr


def test_curve_admits_clients_with_listed_keys_and_refuses_others(tmp_path: Path) -> None:
    keys = make_curve_keys(tmp_path)
    with running_env_server(tmp_path, "--curve", keys.server) as server:

        async def go() -> None:
            async with scripted_client(server.address, curve=keys.client) as client:
                await client.wait_until_ready(20)
                assert (await rollout(client, OK)).reward == 1.0
            for curve_config in (None, keys.stranger):
                async with scripted_client(server.address, curve=curve_config) as client:
                    with pytest.raises(EnvServerError):
                        await client.wait_until_ready(1.5)

        run(go())


def test_the_orchestrators_env_config_carries_curve_keys_to_an_external_server(tmp_path: Path) -> None:
    keys = make_curve_keys(tmp_path)
    with running_env_server(tmp_path, "--curve", keys.server) as server:
        config = EnvConfig(id="bad_envs:load_environment", address=server.address, curve=keys.client)
        env = EnvHandle(config, split="train", client=ScriptedClientConfig(replies=["hi"]), sampling=SamplingParams(max_tokens=8),
                  ready_timeout=20)  # fmt: skip

        async def go() -> list[Any]:
            await env.start()
            try:
                return await env.run_group(OK, n=2, seed=0)
            finally:
                await env.shutdown()

        assert [trace.reward for trace in run(go())] == [1.0, 1.0]


@pytest.mark.parametrize("served", [None, SCRIPTED])
def test_a_handle_refuses_a_server_whose_client_is_not_its_own_naming_both(
    tmp_path: Path, served: dict[str, Any] | None
) -> None:
    """An external server started for another model (or for none) must not feed the run: the
    handle's start fails naming the server's client and the run's."""
    expected = TrainClientConfig(base_url="http://127.0.0.1:9", model="the-run-s-model")
    with running_env_server(tmp_path, client=served) as server:
        config = EnvConfig(id="bad_envs:load_environment", address=server.address)
        env = EnvHandle(config, split="train", client=expected, sampling=SamplingParams(max_tokens=8), ready_timeout=20)

        async def go() -> None:
            try:
                await env.start()
            finally:
                await env.shutdown()

        with pytest.raises(EnvClientMismatch) as refused:
            run(go())
    message = str(refused.value)
    assert f"at {server.address} serves" in message and "the-run-s-model" in message and "http://127.0.0.1:9" in message
    assert ("no model client" if served is None else "the client scripted") in message


def test_elastic_pool_grows_under_load_and_retires_idle_workers(tmp_path: Path) -> None:
    pool = '{"min_workers": 1, "max_workers": 2, "multiplex": 2, "idle_timeout_s": 1}'
    with running_env_server(tmp_path, "--pool", pool, "--env.args", '{"sleep": 1.5}') as server:

        async def go() -> None:
            async with scripted_client(server.address) as client:
                assert (await client.info()).workers == 1
                pending = [asyncio.ensure_future(rollout(client, SLEEP)) for _ in range(4)]
                grown = 1
                while not all(p.done() for p in pending):
                    grown = max(grown, (await client.info()).workers)
                    await asyncio.sleep(0.05)
                assert grown == 2 and all(p.result().reward == 1.0 for p in pending)
                for _ in range(200):
                    if (await client.info()).workers == 1:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError("the idle second worker was not retired")

        run(go())
        wait_until(lambda: len(server.workers()) == 1, 10, "retired worker process gone")
