"""`launch_plan` hands every run a fresh `/update_weights` token and vLLM API key through the environment only,
and env servers get an allow-list of `rl`'s environment (a real env server process checks it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envrl.config import resolve_config
from envrl.launcher.commands import LaunchPlan, launch_plan
from envrl.launcher.config import RLConfig, resolve_run
from envrl.launcher.placement import place
from envrl.runtime.process import spawn
from envrl.runtime.secrets import API_KEY_ENV, RELOAD_TOKEN_ENV

ENVS = '[{"id": "reverse-text", "pass_env": ["ENVRL_TEST_PASSED"]}]'


def plan(tmp_path: Path) -> LaunchPlan:
    overrides = [("orchestrator.envs", ENVS), ("output-dir", str(tmp_path))]
    rl = resolve_config(RLConfig, overrides=overrides)
    return launch_plan(resolve_run(rl), place(rl.trainer, rl.inference, None), None)


def test_each_run_gets_its_own_token_for_inference_and_orchestrator_only_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RELOAD_TOKEN_ENV, raising=False)
    first, second = plan(tmp_path), plan(tmp_path)
    token = first.orchestrator.environ()[RELOAD_TOKEN_ENV]
    assert len(token) >= 32 and second.orchestrator.environ()[RELOAD_TOKEN_ENV] != token
    assert first.inference[0].environ()[RELOAD_TOKEN_ENV] == token
    assert RELOAD_TOKEN_ENV not in first.env_servers[0].environ()
    for command in first.commands():
        assert token not in command.shell() + repr(command) + command.model_dump_json() + " ".join(command.argv)


def test_each_run_gets_its_own_api_key_for_inference_and_every_client_of_it_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    first, second = plan(tmp_path), plan(tmp_path)
    key = first.inference[0].environ()[API_KEY_ENV]
    assert len(key) >= 32 and second.inference[0].environ()[API_KEY_ENV] != key
    assert key != first.orchestrator.environ()[RELOAD_TOKEN_ENV]
    assert first.orchestrator.environ()[API_KEY_ENV] == first.env_servers[0].environ()[API_KEY_ENV] == key
    for command in first.commands():
        assert key not in command.shell() + repr(command) + command.model_dump_json() + " ".join(command.argv)


def test_a_chat_client_of_the_run_s_own_server_sends_the_run_s_api_key(tmp_path: Path) -> None:
    own = {"base_url": "http://127.0.0.1:8000/v1", "model": "m"}
    other = {"base_url": "https://api.example.com/v1", "model": "m"}
    envs = [{"id": "reverse-text", "name": name, "client": client} for name, client in (("own", own), ("other", other))]
    rl = resolve_config(RLConfig, overrides=[("orchestrator.envs", json.dumps(envs)), ("output-dir", str(tmp_path))])
    run = resolve_run(rl)
    clients = {server.name: server.config.model_access.api_key_envs for server in run.env_servers}
    assert clients == {"own": [API_KEY_ENV], "other": []}


def test_a_token_already_in_rl_s_environment_is_the_one_handed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RELOAD_TOKEN_ENV, "operator-chosen")
    assert plan(tmp_path).inference[0].environ()[RELOAD_TOKEN_ENV] == "operator-chosen"


def test_an_env_server_process_sees_the_allow_list_and_pass_env_but_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("ENVRL_TEST_PASSED", "passed")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    command = plan(tmp_path).env_servers[0]
    report = tmp_path / "environ.json"
    code = f"import json, os; open({str(report)!r}, 'w').write(json.dumps(dict(os.environ)))"
    child = spawn([command.argv[0], "-c", code], name="environ probe", env=command.environ())
    try:
        assert child.wait(60) == 0
    finally:
        child.stop(grace=1.0)
    seen = json.loads(report.read_text())
    assert "HF_TOKEN" not in seen and "AWS_SECRET_ACCESS_KEY" not in seen and RELOAD_TOKEN_ENV not in seen
    assert seen["ENVRL_TEST_PASSED"] == "passed" and seen["LC_ALL"] == "C.UTF-8" and "PATH" in seen
