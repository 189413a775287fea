"""Waiting for an inference server that is not there: said while it lasts, and named at the end."""

import asyncio

import pytest
from loguru import logger

from envrl.model import inference as inference_client
from envrl.model.inference import InferenceClient
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
