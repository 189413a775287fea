"""The env worker's model clients: shared by the rollouts that ask for the same client, and never
closed under a rollout that still uses one."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgpack
import pytest

from envrl.serve.worker import MAX_CACHED_CLIENTS
from scripts.tiny_model import DEFAULT_DIR
from tests.integration.env_servers import SAMPLING, raw_exchange, running_env_server

ANSWER_AFTER_S = 1.5
"""How long the model server takes per call: long enough that the first rollout is still waiting
when the later ones push its client out of the cache."""


class SlowChat(BaseHTTPRequestHandler):
    """Enough of vLLM for the train client: the served context length, and a slow completion."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name; GET /v1/models
        self._reply({"data": [{"id": str(DEFAULT_DIR), "max_model_len": 512}]})

    def do_POST(self) -> None:  # noqa: N802 - POST /inference/v1/generate
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(ANSWER_AFTER_S)
        choice = {"index": 0, "token_ids": [5, 6], "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -1.0}]}}
        self._reply({"choices": [{**choice, "finish_reason": "stop"}]})

    def _reply(self, data: object) -> None:
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_model_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_client_pushed_out_of_the_cache_is_not_closed_under_its_running_rollout(
    tmp_path: Path, slow_model_server: str
) -> None:
    """Before: the 17th distinct client closed the first one while its call was in flight, and
    that rollout failed although nothing was wrong with it."""
    access = json.dumps({"base_urls": [slow_model_server], "tokenizers": [str(DEFAULT_DIR)]})
    args = ["--pool", '{"type": "static", "num_workers": 1, "multiplex": 64}', "--model-access", access]
    requests = []
    for i in range(MAX_CACHED_CLIENTS + 2):  # each a distinct client map: only the retry count differs
        client = {
            "type": "train",
            "base_url": slow_model_server,
            "model": str(DEFAULT_DIR),
            "retry": {"max_retries": i},
        }
        params = {"task_idx": 0, "client": client, "sampling": SAMPLING}
        requests.append([msgpack.packb({"id": f"r{i}", "method": "run_rollout", "params": params})])
    with running_env_server(tmp_path, *args, env_id="reverse-text") as server:
        answers = {a["id"]: a for a in raw_exchange(server.address, requests)}
    assert set(answers) == {f"r{i}" for i in range(len(requests))}
    failed = {i: a["result"]["error"] for i, a in answers.items() if not a["ok"] or a["result"]["error"]}
    assert not failed, failed
