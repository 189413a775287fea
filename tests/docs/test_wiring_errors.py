"""A standalone orchestrator refuses an env server without the run's model client in one line that
names the `--client` options the server needs, and exits 2 (README: the standalone orchestrator)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from envrl.model.client import TrainClientConfig
from envrl.serve.config import client_flags
from tests.docs.blocks import ROOT
from tests.support.env_servers import running_env_server
from tests.support.vllm_server import VLLMServer

CONFIG = ROOT / "configs" / "debug" / "external_envs.toml"


def test_a_server_without_the_runs_client_is_refused_naming_the_flags_it_needs(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    with running_env_server(tmp_path, env_id="learnable", client=None) as server:
        done = subprocess.run(
            [
                sys.executable, "-m", "envrl.orchestrator.main", "--config", str(CONFIG),
                "--output-dir", str(tmp_path / "out"), "--inference.base-url", vllm_server.base_url,
                "--model.name", vllm_server.model, "--envs", f'[{{"id": "learnable", "address": "{server.address}"}}]',
            ],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    needed = client_flags(TrainClientConfig(base_url=vllm_server.base_url, model=vllm_server.model))
    errors = [line for line in done.stderr.splitlines() if line.startswith("orchestrator: error:")]
    assert done.returncode == 2 and len(errors) == 1 and needed in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert shlex.split(needed)[:2] == ["--client.type", "train"]
