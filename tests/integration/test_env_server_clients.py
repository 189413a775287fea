"""Bound model clients: a binding the server drops to make room is never one a rollout still
uses, and a run naming a dropped binding is told to bind again."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from envrl.model.tiny import DEFAULT_DIR
from envrl.serve.models import MAX_MODELS
from tests.support.env_servers import SAMPLING, running_env_server
from tests.support.standin_inference import JsonHandler, serving

ANSWER_AFTER_S = 1.5
"""How long the model server takes per call: long enough that the slow rollout is still waiting
when the later bindings fill the server's registry."""


class SlowChat(JsonHandler):
    """Enough of vLLM for the train client: the served context length, and a slow completion."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name; GET /v1/models
        self._reply({"data": [{"id": str(DEFAULT_DIR), "max_model_len": 512}]})

    def do_POST(self) -> None:  # noqa: N802 - POST /inference/v1/generate
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(ANSWER_AFTER_S)
        choice = {"index": 0, "token_ids": [5, 6], "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -1.0}]}}
        self._reply({"choices": [{**choice, "finish_reason": "stop"}]})


@pytest.fixture
def slow_model_server() -> Iterator[str]:
    with serving(SlowChat) as url:
        yield url


def test_a_binding_in_use_is_never_dropped_and_a_dropped_one_is_unknown_model(
    tmp_path: Path, slow_model_server: str
) -> None:
    """Bind a slow train client and start its rollout; bind a scripted client and run it once (its
    worker builds that client); then bind until the registry is full: the idle scripted binding
    is dropped (and closed in its worker), the slow one, in use, is not, and its rollout finishes."""
    access = json.dumps({"base_urls": [slow_model_server], "tokenizers": [str(DEFAULT_DIR)]})
    args = ["--pool", '{"min_workers": 1, "max_workers": 1, "multiplex": 64}', "--model-access", access]
    slow = {"type": "train", "base_url": slow_model_server, "model": str(DEFAULT_DIR), "retry": {"max_retries": 0}}
    with running_env_server(tmp_path, *args, env_id="reverse-text") as server:
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVTIMEO, 120_000)  # a hang guard only: a loaded 2-core box can take many seconds
        dealer.connect(server.address)
        answers: dict[str, Any] = {}

        def send(request_id: str, method: str, params: dict[str, Any]) -> None:
            dealer.send(msgpack.packb({"id": request_id, "method": method, "params": params}))

        def call(request_id: str, method: str | None = None, params: dict[str, Any] | None = None) -> Any:
            if method is not None:
                send(request_id, method, params or {})
            while request_id not in answers:
                answer = msgpack.unpackb(dealer.recv())
                answers[answer["id"]] = answer
            return answers[request_id]

        def run_params(model: str) -> dict[str, Any]:
            return {"task_idx": 0, "model": model, "sampling": SAMPLING}

        try:
            slow_model = call("bind-slow", "bind", {"client": slow})["result"]["model"]
            dropped = call("bind-0", "bind", {"client": {"type": "scripted", "replies": ["0"]}})["result"]["model"]
            assert call("run-0", "run", run_params(dropped))["ok"]
            send("run-slow", "run", run_params(slow_model))
            for i in range(1, MAX_MODELS):
                assert call(f"bind-{i}", "bind", {"client": {"type": "scripted", "replies": [str(i)]}})["ok"]
            assert call("run-dropped", "run", run_params(dropped))["error"]["type"] == "unknown_model"
            finished = call("run-slow")
        finally:
            dealer.close()
    assert finished["ok"] and finished["result"]["traces"][0]["error"] is None, finished
