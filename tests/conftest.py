"""Session-wide fixtures shared by the integration tests.

`vllm_server` starts ONE vLLM-CPU inference server on the tiny model, lazily (only when a test
asks for it), and always stops it; its caches, sockets and logs live in a pytest tmp dir.
A test that changes the served weights must restore them before it ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envrl.config import ModelConfig
from envrl.inference.config import InferenceConfig
from envrl.inference.launch import start
from envrl.telemetry.log import LogConfig
from tests.support.ports import free_port
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR
from tests.support.vllm_server import VLLM_START_TIMEOUT, VLLMServer


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
