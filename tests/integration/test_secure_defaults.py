"""`rl` is secure by default on a shared node: `/update_weights` refuses a caller without the
run's token and vLLM's routes one without the run's API key (while the run's own calls go through), and neither that token nor a secret of
`rl`'s environment reaches the env servers and their workers, which run model-driven code.
Read from the session's smoke run (vLLM, trainer, env servers; tests/integration/conftest.py),
probed while it ran, with the key `rl` makes; a key the operator sets takes the same route
(tests/unit/launcher/test_secrets.py checks it is the one handed on).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from envrl.config import ConfigError, resolve_config
from envrl.data import layout
from envrl.data.private_dir import own_output_dir, refuse_foreign_owner
from envrl.envclient.client import EnvClient
from envrl.envclient.curve import make_curve_keys
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.run import plan
from envrl.launcher.run_dir import resume_argv
from envrl.model.client import ScriptedClientConfig
from envrl.runtime.secrets import API_KEY_ENV, RELOAD_TOKEN_ENV
from envrl.serve.launch import start as start_env_server
from tests.support.other_user import as_nobody, needs_root, reachable_dir
from tests.support.ports import free_base_port
from tests.support.secrets_probe import SECRET, Probe
from tests.support.smoke import FinishedRun


def test_reload_needs_the_run_s_token_and_env_servers_see_neither_it_nor_rl_s_secrets(smoke_run: FinishedRun) -> None:
    smoke_run.check()  # every step's reload went through with the token, rollouts with the key
    seen: Probe = smoke_run.seen
    assert seen.port is not None, "the smoke run never served"
    assert seen.answers["update, no token"] == seen.answers["update, guessed token"] == 401
    assert seen.answers["models, no key"] == 401  # rl made an API key for this run
    servers = [e for e in seen.environs if "envrl.serve" in e["__cmdline__"]]
    inference = [e for e in seen.environs if "envrl.inference.main" in e["__cmdline__"]]
    assert servers and inference
    token, key = inference[0][RELOAD_TOKEN_ENV], inference[0][API_KEY_ENV]
    assert len(token) >= 32 and len(key) >= 32
    assert seen.answers.get("models, the run's key") == 200
    for environ in servers:
        assert SECRET not in environ and RELOAD_TOKEN_ENV not in environ, environ["__cmdline__"]
        assert token not in "\0".join(environ.values())
        assert "PATH" in environ
    out, console = smoke_run.out, smoke_run.console
    logged = "\n".join(
        p.read_text(errors="replace") for p in out.rglob("*") if p.is_file() and p.suffix in (".log", ".toml", ".txt")
    )
    assert token not in logged and token not in console and key not in logged and key not in console


NOBODY_CLIENT = """
import asyncio, os, shutil, sys, tempfile
from pathlib import Path
import zmq.auth
from envrl.envclient.client import EnvClient, EnvServerError
from envrl.serve.config import CurveClientConfig

address, server_public = sys.argv[1], sys.argv[2]
own = Path(tempfile.mkdtemp())  # a key pair of its own, and the server's public key it learned somehow
os.chmod(own, 0o700)
shutil.copy(server_public, own / "server.key")
zmq.auth.create_certificates(own, "nobody")
os.chmod(own / "nobody.key_secret", 0o600)
curve = CurveClientConfig(server_public_key_file=own / "server.key", secret_key_file=own / "nobody.key_secret")

async def attempt(curve):
    try:
        async with EnvClient(address, curve=curve, dead_after=5) as client:
            await client.run(0, sampling={"max_tokens": 8}, timeout=5)
        return "served"
    except EnvServerError as e:
        return f"refused ({e.type})"

print([asyncio.run(attempt(c)) for c in (None, curve)])
"""


def test_another_user_gets_no_rollout_from_the_run_s_env_servers_and_the_run_s_own_client_does(
    tmp_path: Path,
) -> None:
    needs_root()
    with reachable_dir() as shared:
        out = tmp_path / "run"
        overrides = [("orchestrator.envs", '[{"id": "reverse-text"}]'), ("output-dir", str(out))]
        rl = resolve_config(RLConfig, overrides=[*overrides, ("env-server-base-port", str(free_base_port()))])
        run = plan(rl)
        make_curve_keys(layout.curve_dir(out))
        [launch], [env] = run.env_servers, run.orchestrator.envs
        assert launch.config.curve is not None and env.curve is not None
        # canned replies instead of the run's inference server (not started here): the keys are the point
        scripted = launch.config.model_copy(update={"client": ScriptedClientConfig(replies=["hi"])})
        launch = launch.model_copy(update={"config": scripted})
        public = shared / "server.key"  # what another user could at most learn: the server's public key
        shutil.copy(launch.config.curve.secret_key_file.with_suffix(".key"), public)
        public.chmod(0o644)
        argv = launch.argv(launch.write_config(tmp_path))
        child, address = start_env_server(launch, argv=argv, log_file=tmp_path / "env-server.log")
        try:
            attacker = as_nobody([sys.executable, "-c", NOBODY_CLIENT, address, str(public)], timeout=120)
            assert attacker.returncode == 0, attacker.stderr[-3000:]
            assert "served" not in attacker.stdout.replace("refused", ""), attacker.stdout

            async def own() -> list[Any]:
                async with EnvClient(address, curve=env.curve) as client:
                    return await client.run(0, sampling={"max_tokens": 8}, timeout=60)

            traces = asyncio.run(own())  # the run's own orchestrator, with the run's client key
            assert len(traces) == 1 and traces[0].error is None, traces
        finally:
            child.stop(grace=5.0)


def test_a_run_directory_under_a_directory_another_user_can_write_or_owns_is_refused_before_anything_is_read() -> None:
    """Issue 53: another user who can write an ancestor swaps the run dir after rl's owner check
    and plants `configs/rl.toml` (an env id `os:system` then ran their command as the run's user)."""
    needs_root()
    nobody = pwd.getpwnam("nobody").pw_uid
    with reachable_dir() as root:
        theirs, shared, sticky = root / "theirs", root / "shared", root / "sticky"
        for place, mode in ((theirs, 0o755), (shared, 0o775), (sticky, 0o1777)):
            place.mkdir()
            place.chmod(mode)
        os.chown(theirs, nobody, -1)
        for parent, why in ((theirs, "belongs to uid"), (shared, "is writable by its group")):
            run = parent / "run"
            (run / "configs").mkdir(parents=True)
            (run / "configs" / "rl.toml").write_text('[[orchestrator.env]]\nid = "os:system"\n')
            with pytest.raises(ConfigError, match=f"{parent} above it {why}"):
                own_output_dir(run)  # rl eval, the standalone orchestrator
            with pytest.raises(ConfigError, match=f"{parent} above it {why}"):
                refuse_foreign_owner(run)  # rl: prepare, --clean
            with pytest.raises(ConfigError, match=f"{parent} above it {why}"):
                resume_argv(["--resume", "--output-dir", str(run)])  # before configs/rl.toml is read
        own_output_dir(sticky / "run")  # /tmp's rule: others cannot rename what is not theirs
        assert (sticky / "run").stat().st_mode & 0o777 == 0o700
