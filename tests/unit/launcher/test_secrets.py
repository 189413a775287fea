"""The plan names the run's `/update_weights` token and vLLM API key and `make_secrets` makes them fresh for
every run; they reach processes through the environment only, and env servers get an allow-list of `rl`'s
environment (a real env server process checks it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envrl.config import resolve_config
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.commands import RunCommands
from envrl.launcher.plan.run import plan
from envrl.launcher.run_keys import make_secrets
from envrl.runtime.process import spawn
from envrl.runtime.secrets import API_KEY_ENV, RELOAD_TOKEN_ENV

ENVS = '[{"id": "reverse-text", "pass_env": ["ENVRL_TEST_PASSED"]}]'


def launched(tmp_path: Path) -> tuple[RunCommands, dict[str, str]]:
    """The run's commands and the secrets `rl` makes for it when it executes the plan."""
    overrides = [("orchestrator.envs", ENVS), ("output-dir", str(tmp_path))]
    run = plan(resolve_config(RLConfig, overrides=overrides))
    return run.commands, make_secrets(run.secrets)


def test_each_run_gets_its_own_token_for_inference_and_orchestrator_only_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RELOAD_TOKEN_ENV, raising=False)
    (first, made), (second, made_again) = launched(tmp_path), launched(tmp_path)
    token = first.orchestrator.environ(made)[RELOAD_TOKEN_ENV]
    assert len(token) >= 32 and second.orchestrator.environ(made_again)[RELOAD_TOKEN_ENV] != token
    assert first.inference[0].environ(made)[RELOAD_TOKEN_ENV] == token
    assert RELOAD_TOKEN_ENV not in first.env_servers[0].environ(made)
    for command in first.commands():
        assert token not in command.shell() + repr(command) + command.model_dump_json() + " ".join(command.argv)


def test_each_run_gets_its_own_api_key_for_inference_and_every_client_of_it_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    (first, made), (second, made_again) = launched(tmp_path), launched(tmp_path)
    key = first.inference[0].environ(made)[API_KEY_ENV]
    assert len(key) >= 32 and second.inference[0].environ(made_again)[API_KEY_ENV] != key
    assert key != first.orchestrator.environ(made)[RELOAD_TOKEN_ENV]
    assert first.orchestrator.environ(made)[API_KEY_ENV] == first.env_servers[0].environ(made)[API_KEY_ENV] == key
    for command in first.commands():
        assert key not in command.shell() + repr(command) + command.model_dump_json() + " ".join(command.argv)


def test_a_chat_client_of_the_run_s_own_server_sends_the_run_s_api_key(tmp_path: Path) -> None:
    own = {"base_url": "http://127.0.0.1:8000/v1", "model": "m"}
    other = {"base_url": "https://api.example.com/v1", "model": "m"}
    envs = [{"id": "reverse-text", "name": name, "client": client} for name, client in (("own", own), ("other", other))]
    rl = resolve_config(RLConfig, overrides=[("orchestrator.envs", json.dumps(envs)), ("output-dir", str(tmp_path))])
    run = plan(rl)
    clients = {server.name: server.config.client.api_key_env for server in run.env_servers}
    assert clients == {"own": API_KEY_ENV, "other": None}


def test_a_token_already_in_rl_s_environment_is_the_one_handed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RELOAD_TOKEN_ENV, "operator-chosen")
    commands, made = launched(tmp_path)
    assert commands.inference[0].environ(made)[RELOAD_TOKEN_ENV] == "operator-chosen"


def test_an_api_key_already_in_rl_s_environment_is_the_one_inference_and_every_client_of_it_get(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the end-to-end run of a made key (tests/integration/test_secure_defaults.py), this is
    what a key the operator chose changes: which key travels, by the same route."""
    monkeypatch.setenv(API_KEY_ENV, "operator-api-key")
    commands, made = launched(tmp_path)
    got = [command.environ(made)[API_KEY_ENV] for command in (commands.inference[0], commands.orchestrator)]
    assert got + [commands.env_servers[0].environ(made)[API_KEY_ENV]] == ["operator-api-key"] * 3


def test_an_env_server_process_sees_the_allow_list_and_pass_env_but_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("ENVRL_TEST_PASSED", "passed")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    commands, made = launched(tmp_path)
    command = commands.env_servers[0]
    report = tmp_path / "environ.json"
    code = f"import json, os; open({str(report)!r}, 'w').write(json.dumps(dict(os.environ)))"
    child = spawn([command.argv[0], "-c", code], name="environ probe", env=command.environ(made))
    try:
        assert child.wait(60) == 0
    finally:
        child.stop(grace=1.0)
    seen = json.loads(report.read_text())
    assert "HF_TOKEN" not in seen and "AWS_SECRET_ACCESS_KEY" not in seen and RELOAD_TOKEN_ENV not in seen
    assert seen["ENVRL_TEST_PASSED"] == "passed" and seen["LC_ALL"] == "C.UTF-8" and "PATH" in seen
