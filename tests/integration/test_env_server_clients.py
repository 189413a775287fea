"""The server's model client is its config (`--client`, protocol 3): a train client named there
reaches its model server, every worker builds it, and `info` shows it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from envrl.envclient.client import EnvClient
from envrl.model.client import TrainClientConfig
from envrl.serve import protocol as p
from tests.support.env_servers import SAMPLING, run, running_env_server
from tests.support.standin_inference import JsonHandler, serving
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

COMPLETION = [5, 6]
CALLS: list[str] = []
"""The paths of the generate calls the stand-in model server got (appended from its threads)."""
CALLS_LOCK = threading.Lock()


class Chat(JsonHandler):
    """Enough of vLLM for the train client: the served context length, and a fixed completion."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name; GET /v1/models
        self._reply({"data": [{"id": str(DEFAULT_DIR), "max_model_len": 512}]})

    def do_POST(self) -> None:  # noqa: N802 - POST /inference/v1/generate
        self.rfile.read(int(self.headers["Content-Length"]))
        with CALLS_LOCK:
            CALLS.append(self.path)
        choice = {"index": 0, "token_ids": COMPLETION, "logprobs": {"content": [{"logprob": -1.0}] * len(COMPLETION)}}
        self._reply({"choices": [{**choice, "finish_reason": "stop"}]})


@pytest.fixture
def model_server() -> Iterator[str]:
    CALLS.clear()
    with serving(Chat) as url:
        yield url


def test_a_train_client_from_the_servers_config_reaches_its_model_server_from_every_worker(
    tmp_path: Path, model_server: str
) -> None:
    """Two workers, eight rollouts: each is answered with the stand-in's tokens (so each worker got
    and built the client before its first run), and `info` reports the client as configured."""
    client = TrainClientConfig(base_url=model_server, model=str(DEFAULT_DIR), retry={"max_retries": 0})
    pool = '{"min_workers": 2, "max_workers": 2, "multiplex": 4}'
    with running_env_server(tmp_path, "--pool", pool, env_id="reverse-text", client=client) as server:

        async def go() -> tuple[p.ServerInfo, list[list[int]]]:
            async with EnvClient(server.address, timeout=120) as env:
                info = await env.wait_until_ready(60)
                groups = await asyncio.gather(*(env.run(i % 4, sampling=SAMPLING) for i in range(8)))
            return info, [trace.turns[0].tokens.completion_ids for (trace,) in groups]

        info, completions = run(go(), timeout=180)
    assert info.client == p.ClientInfo(
        type="train", base_urls=[model_server], model=str(DEFAULT_DIR), tokenizer=str(DEFAULT_DIR)
    )
    assert completions == [COMPLETION] * 8
    assert len(CALLS) == 8
