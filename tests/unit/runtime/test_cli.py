"""Expected errors end a command in one line with exit 2; the `--client` a refusal prints works as printed."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from envrl.config import load_config
from envrl.model.client import ClientConfig, EvalClientConfig, TrainClientConfig
from envrl.serve.config import EnvServerConfig, client_flags

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "client",
    [
        TrainClientConfig(base_url="http://127.0.0.1:8000", model="deps/models/tiny-chat"),
        TrainClientConfig(base_url=["http://a:1", "http://b:2"], model="m", tokenizer="t", retry={"max_retries": 5}),
        EvalClientConfig(base_url="http://x/v1", model="gpt 4", api_key_env="KEY"),
    ],
)
def test_the_printed_client_flags_give_an_env_server_that_client(client: ClientConfig) -> None:
    argv = ["--env.id", "learnable", *shlex.split(client_flags(client))]
    assert load_config(EnvServerConfig, argv, prog="env-server").client == client


@pytest.mark.parametrize(
    ("command", "argv", "says"),
    [
        ("env-server", ["--env.id", "no-such-env"], "env-server: error: --env.id: no environment 'no-such-env'"),
        ("inference", ["--model.name", "no/such/model"], "inference: error: model.name 'no/such/model': no such"),
        ("trainer", ["--model.name", "no/such/model"], "trainer: error: model.name 'no/such/model': no such"),
        (
            "orchestrator",
            ["--model.name", "no/such/model", "--envs", '[{"id": "learnable"}]'],
            "orchestrator: error: model.name 'no/such/model': no such",
        ),
    ],
)
def test_a_wiring_mistake_is_one_line_and_exit_2(command: str, argv: list[str], says: str, tmp_path: Path) -> None:
    module = "envrl.serve.main" if command == "env-server" else f"envrl.{command}.main"
    address = ["--address", "tcp://127.0.0.1:0"] if command == "env-server" else []
    done = subprocess.run(
        [sys.executable, "-m", module, *argv, *address], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 2 and done.stderr.startswith(says) and done.stderr.count("\n") == 1, done.stderr


def test_rl_resume_says_its_first_line_in_the_runs_log_format(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "rl.toml").write_text((ROOT / "configs" / "debug" / "cpu_smoke.toml").read_text())
    done = subprocess.run(
        [sys.executable, "-m", "envrl.launcher.main", "--resume", "--output-dir", str(tmp_path), "--dry-run"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    first = done.stderr.splitlines()[0]
    assert re.fullmatch(r"\d\d:\d\d:\d\d INFO +rl resuming with the run's stored config .*", first), done.stderr
