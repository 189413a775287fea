"""Waiting for an inference server that is not there: said while it lasts, and named at the end."""

import asyncio
import http.server
import threading

import pytest
from loguru import logger

from envrl.model import inference as inference_client
from envrl.model.inference import InferenceClient
from envrl.runtime.secrets import API_KEY_ENV
from tests.support.ports import free_port


def test_waiting_for_a_missing_server_says_so_while_it_lasts_then_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: one line at the start, then silence for the whole ready_timeout (600 s by default)."""
    monkeypatch.setattr(inference_client, "WAIT_REPORT_S", 0.3)
    url = f"http://127.0.0.1:{free_port()}"
    said: list[str] = []
    sink = logger.add(lambda message: said.append(str(message)), level="INFO")

    async def wait() -> None:
        client = InferenceClient(url, "m")
        try:
            await client.wait_until_ready(1.5)
        finally:
            await client.aclose()

    try:
        with pytest.raises(TimeoutError, match=f"inference server at {url} not ready after 2s"):
            asyncio.run(wait())
    finally:
        logger.remove(sink)
    waiting = [line for line in said if f"still waiting for the inference server at {url}" in line]
    assert waiting and "ConnectError" in waiting[-1]


def test_the_wait_sends_no_api_key_to_whoever_answers_health(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the polls went out on the client that carries the run's API key, so a server another
    local user started on the port learned the key from the first poll."""
    monkeypatch.setenv(API_KEY_ENV, "the-run-s-key")
    seen: list[str | None] = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    async def wait() -> None:
        client = InferenceClient(f"http://127.0.0.1:{server.server_port}", "m")
        try:
            assert client._auth  # generation calls do carry it
            await client.wait_until_ready(10)
        finally:
            await client.aclose()

    try:
        asyncio.run(wait())
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [None]
