"""`orchestrator_envs`: a standalone orchestrator's envs, planned by the code `rl`'s plan uses, and printed by `--dry-run`."""

from pathlib import Path

import pytest

from envrl.config import resolve_config
from envrl.envclient.curve import sidecar_keys
from envrl.envclient.plan import SIDECAR_ADDRESS
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.run import plan
from envrl.model.client import EvalClientConfig, ScriptedClientConfig, TrainClientConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.loop import orchestrator_envs
from envrl.orchestrator.main import main

TEACHER = '{"base_url": "https://api.example.com/v1", "model": "teacher", "api_key_env": "TEACHER_KEY"}'
ENVS = (
    '[{"id": "reverse-text"}, {"id": "reverse-text", "name": "far", "address": "tcp://127.0.0.1:7900"},'
    ' {"id": "reverse-text", "name": "held-out", "train": false},'
    f' {{"id": "reverse-text", "name": "taught", "client": {TEACHER}}}]'
)
EVALS = '[{"env": "held-out"}, {"env": "reverse-text"}, {"env": "far"}]'


def orchestrator_config(tmp_path: Path) -> OrchestratorConfig:
    overrides = [("envs", ENVS), ("eval.env", EVALS), ("output-dir", str(tmp_path / "run"))]
    return resolve_config(OrchestratorConfig, overrides=overrides)


def test_a_standalone_orchestrator_spawns_a_server_on_a_free_loopback_port_for_each_env_without_an_address(
    tmp_path: Path,
) -> None:
    planned = orchestrator_envs(orchestrator_config(tmp_path))
    assert [(env.split, env.name, env.server is not None) for env in planned] == [
        ("train", "reverse-text", True), ("train", "far", False), ("train", "taught", True),
        ("eval", "held-out", True), ("eval", "reverse-text", True), ("eval", "far", False),
    ]  # fmt: skip
    assert {env.server.config.address for env in planned if env.server is not None} == {SIDECAR_ADDRESS}
    # a sidecar's address is known once it is started; an external one is the env's own
    assert [env.env.address for env in planned if env.name == "far"] == ["tcp://127.0.0.1:7900"] * 2
    assert all(env.env.address is None for env in planned if env.server is not None)


def test_each_spawned_server_serves_exactly_the_client_its_handle_uses(tmp_path: Path) -> None:
    config = orchestrator_config(tmp_path)
    planned = orchestrator_envs(config)
    clients = {(env.split, env.name): env.client for env in planned}
    assert clients[("train", "reverse-text")] == config.train_client()
    assert isinstance(clients[("train", "taught")], EvalClientConfig)  # its own chat client
    assert clients[("train", "taught")].base_url == "https://api.example.com/v1"
    for env in planned:
        if env.server is not None:
            assert env.server.config.client == env.client
    assert [env.server.allowed_env() for env in planned if env.name == "taught" and env.server] == [["TEACHER_KEY"]]


def test_every_spawned_server_admits_only_the_orchestrators_curve_key_and_external_ones_keep_their_own(
    tmp_path: Path,
) -> None:
    config = orchestrator_config(tmp_path)
    server_keys, client_keys = sidecar_keys(config.output_dir)
    assert client_keys.secret_key_file.is_relative_to(config.output_dir / "curve")
    for env in orchestrator_envs(config):
        if env.server is not None:  # the sidecar demands the keys its handle connects with
            assert env.server.config.curve == server_keys and env.env.curve == client_keys
        else:
            assert env.env.curve is None  # an external server on loopback: as the user configured it


def test_a_client_given_to_the_plan_replaces_the_runs_but_not_an_envs_own(tmp_path: Path) -> None:
    scripted = ScriptedClientConfig(replies=["hi"])
    clients = {
        (env.split, env.name): env.client for env in orchestrator_envs(orchestrator_config(tmp_path), client=scripted)
    }
    assert clients[("train", "reverse-text")] == scripted and clients[("eval", "held-out")] == scripted
    assert isinstance(clients[("train", "taught")], EvalClientConfig)


def test_the_plan_leaves_the_config_as_it_was_and_touches_no_file(tmp_path: Path) -> None:
    config = orchestrator_config(tmp_path)
    before = config.model_dump(mode="json")
    orchestrator_envs(config)
    assert config.model_dump(mode="json") == before
    assert list(tmp_path.iterdir()) == []


def test_the_orchestrator_rl_starts_spawns_nothing_and_uses_the_clients_rls_servers_serve() -> None:
    rl = resolve_config(RLConfig, overrides=[("orchestrator.envs", ENVS), ("orchestrator.eval.env", EVALS)])
    run = plan(rl)
    planned = orchestrator_envs(run.orchestrator)  # what the orchestrator rl starts runs
    assert all(env.server is None for env in planned)
    served = {(server.split, server.name): server for server in run.env_servers}
    assert sorted(served) == sorted((env.split, env.name) for env in planned if env.name != "far")
    for env in planned:
        if env.name != "far":
            server = served[(env.split, env.name)]
            assert env.env.address == server.config.address
            assert server.config.client == env.client
    assert isinstance(planned[0].client, TrainClientConfig)
    assert planned[0].client.base_urls == run.orchestrator.inference.base_urls


def test_dry_run_prints_the_config_and_each_env_servers_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--envs", ENVS, "--eval.env", EVALS, "--output-dir", str(tmp_path), "--dry-run"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("# ")]
    keys = f"# it admits only the holder of {tmp_path}/curve/clients/orchestrator.key_secret (CURVE keys made before it starts)"
    assert headers == [
        "# orchestrator",
        "# train env server 'reverse-text', spawned on a free loopback port; variables beyond the allow-list: nothing",
        keys,
        "# train env 'far': external server at tcp://127.0.0.1:7900",
        "# train env server 'taught', spawned on a free loopback port; variables beyond the allow-list: TEACHER_KEY",
        keys,
        "# eval env server 'held-out', spawned on a free loopback port; variables beyond the allow-list: nothing",
        keys,
        "# eval env server 'reverse-text', spawned on a free loopback port; variables beyond the allow-list: nothing",
        keys,
        "# eval env 'far': external server at tcp://127.0.0.1:7900",
    ]
    assert out.count("-m envrl.serve.main") == 4
    assert list(tmp_path.iterdir()) == []  # printed, nothing started or written
