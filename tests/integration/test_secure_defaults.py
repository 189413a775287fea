"""`rl` is secure by default on a shared node: `/update_weights` refuses a caller without the
run's token (while the run's own reloads go through), and neither that token nor a secret of
`rl`'s environment reaches the env servers and their workers, which run model-driven code.
A real smoke run (vLLM, trainer, env servers), under the heavy lock.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from envrl.runtime.secrets import API_KEY_ENV, RELOAD_TOKEN_ENV
from tests.support.chaos_runs import marked_pids
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
    out = tmp_path / "secure"
    with rl_process(out, "--max-steps", "4") as (proc, marker):
        port = _wait_until_serving(proc)
        assert _post_update(port, {}) == 401
        assert _post_update(port, {"Authorization": "Bearer guessed"}) == 401
        environs = [e for e in map(_environ, marked_pids(marker)) if e]
        servers = [e for e in environs if "envrl.serve" in e["__cmdline__"]]
        inference = [e for e in environs if "envrl.inference.main" in e["__cmdline__"]]
        assert servers and inference
        token = inference[0][RELOAD_TOKEN_ENV]
        assert len(token) >= 32
        for environ in servers:
            assert SECRET not in environ and RELOAD_TOKEN_ENV not in environ, environ["__cmdline__"]
            assert token not in "\0".join(environ.values())
            assert "PATH" in environ
        code, console = finish(proc, timeout=1500)
    assert code == 0, console[-3000:]  # every step's reload went through with the token
    assert [m["step"] for m in metric_lines(out) if "trainer/loss" in m] == [0, 1, 2, 3]
    logged = "\n".join(
        p.read_text(errors="replace") for p in out.rglob("*") if p.is_file() and p.suffix in (".log", ".toml", ".txt")
    )
    assert token not in logged and token not in console


def test_with_an_api_key_set_vllm_s_routes_demand_it_and_the_run_s_clients_send_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_KEY_ENV, "run-api-key")
    out = tmp_path / "keyed"
    with rl_process(out, "--max-steps", "2") as (proc, _):
        port = _wait_until_serving(proc)
        assert _get(port, "/v1/models", {}) == 401
        assert _get(port, "/v1/models", {"Authorization": "Bearer run-api-key"}) == 200
        code, console = finish(proc, timeout=1500)
    assert code == 0, console[-3000:]  # the orchestrator and the env servers generated with the key
    assert [m["step"] for m in metric_lines(out) if "trainer/loss" in m] == [0, 1]
