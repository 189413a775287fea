"""`EnvClient` against a hand-written ROUTER on loopback: answers it cannot read still end the call."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from envrl.envclient.client import BAD_RESPONSE, EnvClient, EnvServerError


@pytest.fixture
def answering_router() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A ROUTER on 127.0.0.1 that answers each request with the next reply of the list the test
    fills (`{id}` is the request's id); stopped and closed even when the test fails."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    replies: list[dict[str, Any]] = []
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            if not sock.poll(50):
                continue
            identity, frame = sock.recv_multipart()
            request = msgpack.unpackb(frame)
            if request["method"] == "health" and not replies:
                continue  # the client's own probes
            reply = replies.pop(0)
            sock.send_multipart([identity, msgpack.packb({**reply, "id": request["id"]})])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}", replies
    finally:
        stop.set()
        thread.join(5)
        sock.close()
        context.term()


def test_an_answer_that_is_no_protocol_response_fails_its_call_as_bad_response(
    answering_router: tuple[str, list[dict[str, Any]]],
) -> None:
    address, replies = answering_router
    replies += [
        {"ok": False, "error": {"type": "some_future_error", "message": "?"}},
        {"ok": True},  # no result
    ]

    async def go() -> list[BaseException]:
        async with EnvClient(address) as client:
            calls = [client.info(timeout=10), client.info(timeout=10)]
            return await asyncio.gather(*calls, return_exceptions=True)

    errors = asyncio.run(asyncio.wait_for(go(), 20))
    assert all(isinstance(e, EnvServerError) and e.type == BAD_RESPONSE for e in errors), errors
    assert "not a protocol v3 response" in str(errors[0])


def test_at_capacity_answers_are_retried_with_backoff_until_the_capacity_wait_and_counted(
    answering_router: tuple[str, list[dict[str, Any]]],
) -> None:
    address, replies = answering_router
    replies += [{"ok": False, "error": {"type": "at_capacity", "message": "full"}}] * 1000
    counted: list[int] = []

    async def go() -> BaseException | None:
        client = EnvClient(
            address, capacity_wait=1.0, on_at_capacity=lambda: counted.append(1), health_interval=60, dead_after=120
        )
        async with client:
            try:
                await client.info(timeout=30)
            except EnvServerError as e:
                return e
        return None

    error = asyncio.run(asyncio.wait_for(go(), 20))
    assert isinstance(error, EnvServerError) and error.type == "at_capacity"
    sent = 1000 - len(replies)
    # Retry k pauses at least half of 20 ms * 2^k, so the pauses before retry k add up to at least
    # 10 ms * (2^k - 1), which passes the 1 s capacity wait at k = 7: at most 7 retries, 8 requests,
    # however fast or slow the machine (without backoff a call re-sends thousands of times a second).
    assert 2 <= sent <= 8, sent
    assert len(counted) == sent - 1
