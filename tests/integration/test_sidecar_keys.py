"""The env servers `rl eval` and a standalone orchestrator spawn themselves admit only their own
client, on loopback too: a client without keys, or with a key pair of its own, gets no rollout
(real servers on loopback, scripted model), while the process's own handles run rollouts; the
keys are private to their owner and never logged; no server or worker has its config (the
model client, the env's args) on a command line, which every local user can read."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
import zmq.auth

from envrl.config import load_config, resolve_config
from envrl.data.layout import curve_dir, env_server_process, process_config_file
from envrl.envclient.client import EnvClient, EnvServerError
from envrl.envclient.config import EnvConfig
from envrl.envclient.curve import sidecar_keys
from envrl.envclient.handles import EnvHandle
from envrl.envclient.plan import plan_env
from envrl.envclient.sidecars import Sidecars
from envrl.eval.config import EvalCommandConfig
from envrl.eval.runner import Evaluation
from envrl.model.client import ScriptedClientConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.loop import Orchestrator, orchestrator_envs
from envrl.runtime.restarts import RestartPolicy
from envrl.serve.config import CurveClientConfig, PoolConfig
from tests.support.env_servers import children, cmdline

POOL = {"min_workers": 1, "max_workers": 1}
CANARY = "a-reply-only-this-user-may-read"
SCRIPTED = {"type": "scripted", "replies": [CANARY]}
ENVS = [{"id": "reverse-text", "pool": POOL}, {"id": "reverse-text", "name": "second", "pool": POOL}]
"""Two envs, whose servers start at once: both must get the same keys."""


@asynccontextmanager
async def eval_sidecars(out: Path):
    """The handles of `rl eval`'s envs, their servers spawned as `rl eval` spawns them."""
    argv = ["--env", json.dumps(ENVS), "--client", json.dumps(SCRIPTED)]
    evaluation = Evaluation(load_config(EvalCommandConfig, [*argv, "--output-dir", str(out)], prog="rl eval"))
    try:
        await asyncio.gather(*(env.start() for env in evaluation.envs))
        yield evaluation.envs
    finally:
        await asyncio.gather(*(env.shutdown() for env in evaluation.envs), return_exceptions=True)
        await evaluation.sidecars.close()


@asynccontextmanager
async def orchestrator_sidecars(out: Path):
    """The handles of a standalone orchestrator's train envs, their servers spawned as it spawns them."""
    overrides = [("envs", json.dumps(ENVS)), ("output-dir", str(out)), ("wandb", '{"mode": "disabled"}')]
    config = resolve_config(OrchestratorConfig, overrides=overrides)
    orchestrator = Orchestrator(config, orchestrator_envs(config, client=ScriptedClientConfig(**SCRIPTED)))
    try:
        await asyncio.gather(*(env.start() for env in orchestrator.train_envs.envs))
        yield orchestrator.train_envs.envs
    finally:
        await orchestrator.close()


async def attempt(address: str, curve: CurveClientConfig | None) -> str:
    """What a client with `curve` gets from the server at `address`: a rollout, or refused."""
    try:
        async with EnvClient(address, curve=curve, dead_after=3) as client:
            [trace] = await client.run(0, sampling={"max_tokens": 8}, timeout=20)
        return "served" if trace.error is None else f"failed ({trace.error.type})"
    except EnvServerError as e:
        return f"refused ({e.type})"


def own_keys(where: Path) -> CurveClientConfig:
    """A key pair of a stranger's own, with the server's public key it learned somehow."""
    where.mkdir(mode=0o700)
    _, secret = zmq.auth.create_certificates(where, "stranger")
    os.chmod(secret, 0o600)
    _, client = sidecar_keys(where.parent / "out")
    return CurveClientConfig(server_public_key_file=client.server_public_key_file, secret_key_file=Path(secret))


Spawner = Callable[[Path], AbstractAsyncContextManager[list[EnvHandle]]]


@pytest.mark.parametrize("spawner", [eval_sidecars, orchestrator_sidecars], ids=["rl eval", "orchestrator"])
def test_a_spawned_sidecar_serves_only_the_client_holding_its_key(tmp_path: Path, spawner: Spawner) -> None:
    out = tmp_path / "out"

    async def run() -> dict[str, str]:
        async with spawner(out) as envs:
            env = envs[0]
            assert env.config.curve is not None  # the handle connects with the planned client keys
            tried = {"no key": None, "a stranger's key": own_keys(tmp_path / "stranger"), "its own": env.config.curve}
            outcomes = {who: await attempt(env.address, curve) for who, curve in tried.items()}
            server = env.sidecars.pid(env.address)
            assert server is not None
            command_lines[server] = cmdline(server).split(b"\0")[:-1]
            command_lines.update({worker: cmdline(worker).split(b"\0")[:-1] for worker in children(server)})
            for handle in envs:
                traces = await handle.run_group(0, n=1, seed=0)
                outcomes[f"handle {handle.name}"] = "failed" if traces[0].has_error else "served"
            return outcomes

    command_lines: dict[int, list[bytes]] = {}
    outcomes = asyncio.run(run())
    assert outcomes == {
        "no key": "refused (unavailable)",
        "a stranger's key": "refused (unavailable)",
        "its own": "served",
        "handle reverse-text": "served",
        "handle second": "served",
    }
    keys = curve_dir(out)
    server, client = sidecar_keys(out)
    for directory in (keys, keys / "clients"):
        assert directory.stat().st_mode & 0o777 == 0o700, oct(directory.stat().st_mode)
    for secret in (server.secret_key_file, client.secret_key_file):
        assert secret.stat().st_mode & 0o777 == 0o600, oct(secret.stat().st_mode)
    secrets = [zmq.auth.load_certificate(path)[1] for path in (server.secret_key_file, client.secret_key_file)]
    logged = b"".join(path.read_bytes() for path in (out / "logs").rglob("*") if path.is_file())
    assert logged and not any(secret in logged for secret in secrets)
    # The server's config (its client, whose replies are the canary) comes from a file of this
    # user's; each worker's (the env's args) from its environment; neither from a command line.
    split = "eval" if spawner is eval_sidecars else "train"
    config_file = process_config_file(out, env_server_process(split, "reverse-text"))
    assert CANARY in config_file.read_text() and config_file.stat().st_mode & 0o777 == 0o600
    server_argv, *workers_argv = command_lines.values()
    assert server_argv[-4:] == [b"-m", b"envrl.serve.main", b"--config", str(config_file).encode()], server_argv
    assert workers_argv and all(argv[-2:] == [b"-m", b"envrl.serve.worker"] for argv in workers_argv), workers_argv


def test_sidecars_refuse_to_spawn_a_server_planned_without_their_keys(tmp_path: Path) -> None:
    sidecars = Sidecars(tmp_path, RestartPolicy(), ready_timeout=60)
    elsewhere = sidecar_keys(tmp_path / "elsewhere")
    env = EnvConfig(id="reverse-text", pool=PoolConfig(**POOL))
    planned = plan_env(env, "train", ScriptedClientConfig(replies=["hi"]), RestartPolicy(), curve=elsewhere)
    assert planned.server is not None
    with pytest.raises(ValueError, match=r"must demand the CURVE keys in .*/curve, not"):
        asyncio.run(sidecars.serve(planned.server, lambda: None))
    assert not curve_dir(tmp_path).exists() and sidecars.supervisor.children == []
