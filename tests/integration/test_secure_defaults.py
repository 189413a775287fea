"""`rl` is secure by default on a shared node: `/update_weights` refuses a caller without the
run's token and vLLM's routes one without the run's API key (while the run's own calls go through), and neither that token nor a secret of
`rl`'s environment reaches the env servers and their workers, which run model-driven code.
A real smoke run (vLLM, trainer, env servers), under the heavy lock: one run, with the key `rl` makes;
a key the operator sets takes the same route (tests/unit/launcher/test_secrets.py checks it is the one
handed on).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from envrl.config import resolve_config
from envrl.data import layout
from envrl.envclient.curve import make_curve_keys
from envrl.launcher.config import RLConfig
from envrl.launcher.plan import plan
from envrl.model.client import ScriptedClientConfig
from envrl.runtime.secrets import API_KEY_ENV, RELOAD_TOKEN_ENV
from envrl.serve.client import EnvClient
from envrl.serve.launch import start as start_env_server
from tests.support.chaos_runs import marked_pids
from tests.support.other_user import as_nobody, needs_root, reachable_dir
from tests.support.ports import free_base_port
from tests.support.run_files import metric_lines
from tests.support.smoke import finish, rl_process

SECRET = "ENVRL_TEST_CLOUD_KEY"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return {}
    entries = dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)
    return {"__cmdline__": cmdline.replace(b"\0", b" ").decode(errors="replace")} | {
        k.decode(errors="replace"): v.decode(errors="replace") for k, v in entries.items()
    }


def _post_update(port: int, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/update_weights",
        data=json.dumps({"path": "/nonexistent", "step": 10_000}).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def _get(port: int, path: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def _wait_until_serving(proc: subprocess.Popen[bytes]) -> int:
    """The port of the run's inference server, once it answers /health (the run must stay alive)."""
    port = int(proc.args[proc.args.index("--inference.port") + 1])  # type: ignore[union-attr]
    deadline = time.monotonic() + 900
    while not _healthy(port):
        assert proc.poll() is None, finish(proc, 10)[1][-3000:]
        assert time.monotonic() < deadline, "the inference server never became healthy"
        time.sleep(0.2)
    return port


def test_reload_needs_the_run_s_token_and_env_servers_see_neither_it_nor_rl_s_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET, "do-not-leak")
    monkeypatch.delenv(RELOAD_TOKEN_ENV, raising=False)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    out = tmp_path / "secure"
    with rl_process(out, "--max-steps", "4") as (proc, marker):
        port = _wait_until_serving(proc)
        assert _post_update(port, {}) == 401
        assert _post_update(port, {"Authorization": "Bearer guessed"}) == 401
        assert _get(port, "/v1/models", {}) == 401  # rl made an API key for this run
        environs = [e for e in map(_environ, marked_pids(marker)) if e]
        servers = [e for e in environs if "envrl.serve" in e["__cmdline__"]]
        inference = [e for e in environs if "envrl.inference.main" in e["__cmdline__"]]
        assert servers and inference
        token, key = inference[0][RELOAD_TOKEN_ENV], inference[0][API_KEY_ENV]
        assert len(token) >= 32 and len(key) >= 32
        assert _get(port, "/v1/models", {"Authorization": f"Bearer {key}"}) == 200
        for environ in servers:
            assert SECRET not in environ and RELOAD_TOKEN_ENV not in environ, environ["__cmdline__"]
            assert token not in "\0".join(environ.values())
            assert "PATH" in environ
        code, console = finish(proc, timeout=1500)
    assert code == 0, console[-3000:]  # every step's reload went through with the token, rollouts with the key
    assert [m["step"] for m in metric_lines(out) if "trainer/loss" in m] == [0, 1, 2, 3]
    logged = "\n".join(
        p.read_text(errors="replace") for p in out.rglob("*") if p.is_file() and p.suffix in (".log", ".toml", ".txt")
    )
    assert token not in logged and token not in console and key not in logged and key not in console


NOBODY_CLIENT = """
import asyncio, os, shutil, sys, tempfile
from pathlib import Path
import zmq.auth
from envrl.model.client import ScriptedClientConfig
from envrl.serve.client import EnvClient, EnvServerError
from envrl.serve.config import CurveClientConfig

address, server_public = sys.argv[1], sys.argv[2]
own = Path(tempfile.mkdtemp())  # a key pair of its own, and the server's public key it learned somehow
os.chmod(own, 0o700)
shutil.copy(server_public, own / "server.key")
zmq.auth.create_certificates(own, "nobody")
os.chmod(own / "nobody.key_secret", 0o600)
curve = CurveClientConfig(server_public_key_file=own / "server.key", secret_key_file=own / "nobody.key_secret")

async def attempt(curve):
    model = ScriptedClientConfig(replies=["hi"])
    try:
        async with EnvClient(address, model=model, curve=curve, dead_after=5) as client:
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
        public = shared / "server.key"  # what another user could at most learn: the server's public key
        shutil.copy(launch.config.curve.secret_key_file.with_suffix(".key"), public)
        public.chmod(0o644)
        child, address = start_env_server(launch, log_file=tmp_path / "env-server.log")
        try:
            attacker = as_nobody([sys.executable, "-c", NOBODY_CLIENT, address, str(public)], timeout=120)
            assert attacker.returncode == 0, attacker.stderr[-3000:]
            assert "served" not in attacker.stdout.replace("refused", ""), attacker.stdout

            async def own() -> list[Any]:
                model = ScriptedClientConfig(replies=["hi"])
                async with EnvClient(address, model=model, curve=env.curve) as client:
                    return await client.run(0, sampling={"max_tokens": 8}, timeout=60)

            traces = asyncio.run(own())  # the run's own orchestrator, with the run's client key
            assert len(traces) == 1 and traces[0].error is None, traces
        finally:
            child.stop(grace=5.0)
