"""`request_json` never holds more of a response than its byte bound, over both HTTP clients,
whether the server announces the size (Content-Length) or streams it (chunked)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from envrl.runtime.http import ResponseTooLarge, RetryPolicy, keep_alive_session, request_json

LIMIT = 4096


def answer(size: int, chunked: bool) -> bytes:
    body = json.dumps({"pad": "x" * size}).encode()
    if not chunked:
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    parts = [body[i : i + 1000] for i in range(0, len(body), 1000)]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


async def call(size: int, chunked: bool, client_kind: str) -> object:
    """One POST to a loopback server that answers a JSON body of about `size` bytes."""
    served = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        served += 1
        writer.write(answer(size, chunked))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
    policy = RetryPolicy(max_retries=2, backoff_s=0.01)
    try:
        if client_kind == "aiohttp":
            async with keep_alive_session() as session:
                result = await request_json(session, "POST", url, {"q": 1}, policy, max_bytes=LIMIT)
        else:
            async with httpx.AsyncClient() as client:
                result = await request_json(client, "POST", url, {"q": 1}, policy, max_bytes=LIMIT)
    finally:
        server.close()
        await server.wait_closed()
    assert served == 1  # an oversized answer is refused at once, not retried
    return result


@pytest.mark.parametrize("client_kind", ["aiohttp", "httpx"])
@pytest.mark.parametrize("chunked", [False, True])
def test_a_response_past_the_bound_is_refused_and_one_within_it_is_read(client_kind, chunked):
    assert asyncio.run(call(LIMIT - 100, chunked, client_kind)) == {"pad": "x" * (LIMIT - 100)}
    with pytest.raises(ResponseTooLarge, match=f"larger than {LIMIT} bytes"):
        asyncio.run(call(LIMIT * 10, chunked, client_kind))
