"""KeepAlivePool against a real loopback HTTP/1.1 server: connections are kept and reused, a
connection the server closed while idle is replaced without an error, chunked bodies are read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from envrl.http import HttpCallError, KeepAlivePool, RetryPolicy, request_json

Answer = Callable[[dict[str, Any]], Awaitable[bytes]]


async def keep_alive(body: dict[str, Any]) -> bytes:
    if body == {"bad": True}:
        return b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad request"
    data = json.dumps({"echo": body}).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)


class Server:
    """Answers each request on a connection with `answer(body)`; `close_after_each` hangs up
    after every answer without saying so (as a server does with an idle connection)."""

    def __init__(self, answer: Answer = keep_alive, close_after_each: bool = False) -> None:
        self.answer = answer
        self.close_after_each = close_after_each
        self.connections = 0
        self.requests = 0

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = json.loads(await reader.readexactly(length) or b"null")
                self.requests += 1
                writer.write(await self.answer(body))
                await writer.drain()
                if self.close_after_each:  # unread: the client's next request on this connection
                    await asyncio.sleep(0.05)
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()


def test_calls_reuse_kept_alive_connections() -> None:
    async def main() -> None:
        server = Server()
        async with server as url:
            pool = KeepAlivePool(url)
            for i in range(5):
                assert await request_json(pool, "POST", f"{url}/x", {"i": i}) == {"echo": {"i": i}}
            with pytest.raises(HttpCallError, match="HTTP 400: bad request") as refused:
                await request_json(pool, "POST", f"{url}/x", {"bad": True})
            assert refused.value.status == 400
            assert server.connections == 1
            answers = await asyncio.gather(*(request_json(pool, "POST", f"{url}/x", {"i": i}) for i in range(8)))
            assert answers == [{"echo": {"i": i}} for i in range(8)] and server.connections <= 8
            opened = server.connections
            await asyncio.gather(*(request_json(pool, "POST", f"{url}/x", {"i": i}) for i in range(8)))
            assert server.connections == opened, "a second round of 8 calls opened new connections"
            await pool.aclose()

    asyncio.run(main())


def test_a_connection_closed_by_the_server_while_idle_is_replaced_without_an_error() -> None:
    async def main() -> None:
        server = Server(close_after_each=True)
        async with server as url:
            pool = KeepAlivePool(url)
            no_retries = RetryPolicy(max_retries=0)
            for i in range(3):  # each call after the first goes out on a connection the server then drops
                assert await request_json(pool, "POST", f"{url}/x", {"i": i}, no_retries) == {"echo": {"i": i}}
            assert (server.connections, server.requests) == (3, 3)
            await pool.aclose()

    asyncio.run(main())


def test_chunked_answers_are_read_whole() -> None:
    async def chunked(body: dict[str, Any]) -> bytes:
        data = json.dumps({"echo": body}).encode()
        half = len(data) // 2
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (
            half, data[:half], len(data) - half, data[half:]
        )  # fmt: skip

    async def main() -> None:
        server = Server(chunked)
        async with server as url:
            pool = KeepAlivePool(url)
            assert await request_json(pool, "POST", f"{url}/x", {"a": [1, 2, 3]}) == {"echo": {"a": [1, 2, 3]}}
            assert await request_json(pool, "GET", f"{url}/y") == {"echo": None}
            assert server.connections == 1
            await pool.aclose()

    asyncio.run(main())
