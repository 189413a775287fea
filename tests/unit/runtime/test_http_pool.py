"""The generation session (`keep_alive_session`) with `request_json` against a real loopback
HTTP/1.1 server: connections are kept and reused, none capped, and a connection the server
dropped while idle costs a retry, not the call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from envrl.runtime.http import HttpCallError, RetryPolicy, keep_alive_session, request_json

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
            pool = keep_alive_session()
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
            await pool.close()

    asyncio.run(main())


def test_a_connection_the_server_dropped_while_idle_costs_a_retry_not_the_call() -> None:
    async def main() -> None:
        server = Server(close_after_each=True)
        async with server as url:
            pool = keep_alive_session()
            quick = RetryPolicy(max_retries=1, backoff_s=0.01)
            for i in range(3):  # each call after the first may go out on a connection the server then drops
                assert await request_json(pool, "POST", f"{url}/x", {"i": i}, quick) == {"echo": {"i": i}}
            assert server.requests == 3 and server.connections >= 3
            await pool.close()

    asyncio.run(main())
