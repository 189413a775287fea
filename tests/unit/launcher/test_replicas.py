"""`placement.inference.replicas = k` in an `rl` config: k servers on consecutive ports, every client told of all."""

import socket
import sys
import time
from pathlib import Path

import pytest

from envrl.config import ConfigError, resolve_config
from envrl.inference.config import InferenceConfig
from envrl.launcher.config import RLConfig
from envrl.launcher.main import main
from envrl.launcher.plan.run import plan
from envrl.launcher.replicas import wait_for_replicas
from envrl.runtime.process import ChildFailed, spawn
from envrl.runtime.supervisor import Supervisor

ONE_ENV = ("orchestrator.envs", '[{"id": "reverse-text"}]')


def test_each_replica_gets_its_own_port_config_and_name_and_every_client_all_urls() -> None:
    rl = resolve_config(
        RLConfig, overrides=[ONE_ENV, ("placement.inference.replicas", "3"), ("inference.port", "8100")]
    )
    run = plan(rl)
    replicas = run.replicas
    assert {name: config.port for name, config in replicas.items()} == {
        "inference-0": 8100, "inference-1": 8101, "inference-2": 8102,
    }  # fmt: skip
    assert all(config.vllm == rl.inference.vllm for config in replicas.values())
    urls = ["http://127.0.0.1:8100", "http://127.0.0.1:8101", "http://127.0.0.1:8102"]
    assert run.orchestrator.inference.base_urls == urls
    [server] = run.env_servers
    assert server.config.client.base_urls == urls
    one = plan(resolve_config(RLConfig, overrides=[ONE_ENV]))
    assert list(one.replicas) == ["inference"] and one.orchestrator.inference.base_url == one.inference.base_url


def test_a_replica_port_taken_by_an_env_server_is_an_error_naming_both() -> None:
    rl = resolve_config(
        RLConfig,
        overrides=[
            ONE_ENV,
            ("placement.inference.replicas", "2"),
            ("inference.port", "7999"),
            ("env-server-base-port", "8000"),
        ],
    )
    with pytest.raises(ConfigError, match=r"inference-1 and train env 'reverse-text' would both use port 8000"):
        plan(rl)
    with pytest.raises(ConfigError, match=r"needs ports up to 65536, past 65535"):
        plan(
            resolve_config(
                RLConfig, overrides=[ONE_ENV, ("placement.inference.replicas", "2"), ("inference.port", "65535")]
            )
        )


def test_dry_run_prints_every_replicas_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--orchestrator.envs", ONE_ENV[1], "--placement.inference.replicas", "2", "--dry-run"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    # (a "# warning: ports already in use" line appears when something else on the node holds a port)
    headers = [line for line in out.splitlines() if line.startswith("# ") and not line.startswith("# warning")]
    assert headers[:3] == ["# inference-0", "# inference-1", "# trainer"]
    assert "port = 8001" in out


def test_the_inference_commands_former_replicas_key_is_ignored_with_a_warning_naming_rls() -> None:
    warned: list[str] = []
    config = resolve_config(InferenceConfig, overrides=[("replicas", "2"), ("gpus", "[0]")], warn=warned.append)
    assert config == InferenceConfig()
    assert [line.split(" (from")[0] for line in warned] == ["config key 'gpus'", "config key 'replicas'"]
    assert "placement.inference" in warned[1] and "serves one replica" in warned[1]


def test_inference_that_never_serves_fails_the_run_at_its_one_start_up_limit_naming_the_key(tmp_path: Path) -> None:
    with socket.socket() as held:  # bound, never listening: every /health try is refused
        held.bind(("127.0.0.1", 0))
        config = InferenceConfig(port=held.getsockname()[1])
        child = spawn(
            [sys.executable, "-c", "import time; time.sleep(60)"], name="inference", log_file=tmp_path / "i.log"
        )
        supervisor = Supervisor(grace=1.0)
        supervisor.add(child)
        try:
            with pytest.raises(ChildFailed, match=r"(?s)did not serve .*limit, inference\.ready_timeout_s"):
                wait_for_replicas({"inference": child}, {"inference": config}, supervisor, time.monotonic() + 1.0)
            assert child.poll() is None  # failed on the limit, not on a death
        finally:
            supervisor.stop_all()
