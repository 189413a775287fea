"""The chat proxy against hostile requests, over real loopback HTTP: bodies that are not chat
requests are recorded 400s, bodies past the limits 413 unread, calls past a session's caps 429,
one session's calls run one at a time, and its logs are throttled and never hold a session id."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from loguru import logger

from envrl.data.traces import Message
from envrl.model.client import ModelResponse, SamplingArgs, ScriptedClient, ScriptedClientConfig
from envrl.proxy.chat import (
    MAX_JSON_DEPTH,
    MAX_JSON_VALUES,
    MAX_WAITING,
    ChatProxy,
    ProxyLimits,
    Session,
)

SESSION = "0123456789abcdef" * 2
HELLO = {"messages": [{"role": "user", "content": "hi"}]}


@asynccontextmanager
async def proxy_session(
    limits: ProxyLimits | None = None, respond: Callable[[list[Message]], str] | None = None, delay_s: float = 0.0
) -> AsyncIterator[tuple[ChatProxy, Session, str]]:
    """A started proxy with one open session, and its session URL; stopped on exit."""
    proxy = ChatProxy(limits)
    await proxy.start()
    try:
        client = ScriptedClient(ScriptedClientConfig(replies=["12 34"], delay_s=delay_s), respond=respond)
        session = proxy.open(SESSION, client, SamplingArgs(max_tokens=8))
        yield proxy, session, proxy.session_url(SESSION) + "/chat/completions"
    finally:
        await proxy.stop()


async def post(url: str, data: bytes) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(url, data=data) as response:
        return response.status, await response.json()


@asynccontextmanager
async def captured_warnings() -> AsyncIterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        yield lines
    finally:
        logger.remove(sink)


def test_bodies_that_are_not_chat_requests_are_recorded_400s_logged_throttled_without_the_id() -> None:
    bad = [
        b"not json",
        b'{"messages": [1, 2]}',
        b'[{"role": "user", "content": "hi"}]',
        b'{"messages": [{"content": "no role"}]}',
        b'{"messages": [{"role": "user"}], "tools": "x"}',
        b'{"messages": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}",
        b'{"messages": [' + b"{}," * MAX_JSON_VALUES + b"{}]}",
    ]

    async def main() -> None:
        async with captured_warnings() as lines, proxy_session() as (_, session, url):
            for body in bad:
                status, answer = await post(url, body)
                assert status == 400, (body[:40], answer)
                assert answer["error"]["type"] == "envrl_proxy_error"
            assert session.refused == len(bad) and session.turns == []
            assert session.failure is not None and "refused (400)" in session.failure
            for _ in range(100):  # a flood of them: the log keeps a few lines, not a hundred tracebacks
                assert (await post(url, b"{"))[0] == 400
            assert session.refused == len(bad) + 100
            status, answer = await post(url, json.dumps(HELLO).encode())  # the session still works
            assert status == 200 and answer["choices"][0]["message"]["content"] == "12 34"
        assert 1 <= len(lines) <= 12, len(lines)  # Throttle's burst of 10 per minute, plus slack for none else
        text = "".join(lines)
        assert SESSION not in text and SESSION[:8] in text
        assert "Traceback" not in text

    asyncio.run(main())


def test_a_request_for_an_unknown_session_is_400_and_its_id_is_not_logged() -> None:
    async def main() -> None:
        async with captured_warnings() as lines, proxy_session() as (proxy, _, _):
            guess = "f" * 32
            status, _ = await post(proxy.session_url(guess) + "/chat/completions", json.dumps(HELLO).encode())
            assert status == 400
        assert guess not in "".join(lines)

    asyncio.run(main())


def test_a_body_past_max_body_kib_is_413_and_is_not_read() -> None:
    async def main() -> None:
        async with proxy_session(ProxyLimits(max_body_kib=64)) as (proxy, session, url):
            # Announced past the limit: answered from the headers, the body never sent.
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            path = url.split(str(proxy.port), 1)[1]
            writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {60 << 20}\r\n\r\n".encode())
            await writer.drain()
            head = await asyncio.wait_for(reader.readline(), 10)
            assert b" 413 " in head, head
            writer.close()

            # Chunked (no length): read up to the limit, then refused.
            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(64):
                    yield b" " * 4096

            async with aiohttp.ClientSession() as http:
                try:
                    async with http.post(url, data=chunks()) as response:
                        status = response.status
                except aiohttp.ClientError:  # the proxy may close before the client finished sending
                    status = 413
            assert status == 413
            assert session.refused == 2 and session.received <= (64 << 10) + (64 << 10)

    asyncio.run(main())


def test_calls_and_bytes_past_a_sessions_caps_are_429_and_recorded() -> None:
    async def main() -> None:
        async with proxy_session(ProxyLimits(max_calls=2)) as (_, session, url):
            assert [(await post(url, json.dumps(HELLO).encode()))[0] for _ in range(3)] == [200, 200, 429]
            assert session.refused == 1 and len(session.turns) == 2 and "max_calls" in (session.failure or "")
        padded = {**HELLO, "user": " " * (600 << 10)}
        async with proxy_session(ProxyLimits(max_session_mib=1)) as (_, session, url):
            assert [(await post(url, json.dumps(padded).encode()))[0] for _ in range(2)] == [200, 429]
            assert session.refused == 1 and "max_session_mib" in (session.failure or "")

    asyncio.run(main())


def test_calls_of_one_session_run_one_at_a_time_and_each_extends_the_last() -> None:
    seen: list[int] = []
    holder: list[Session] = []

    def respond(messages: list[Message]) -> str:
        seen.append(len(holder[0].turns))  # turns recorded when this call started
        return "ok"

    async def main() -> None:
        async with proxy_session(respond=respond, delay_s=0.2) as (_, session, url):
            holder.append(session)
            body = json.dumps(HELLO).encode()
            statuses = await asyncio.gather(*(post(url, body) for _ in range(4)))
            assert [s for s, _ in statuses] == [200] * 4
            assert len(session.turns) == 4

    asyncio.run(main())
    assert seen == [0, 1, 2, 3]  # each call saw every earlier one recorded (concurrent calls would see 0, 0, ...)


class GatedClient(ScriptedClient):
    """Answers only once `gate` is set (the model is busy until the test says so)."""

    def __init__(self) -> None:
        super().__init__(ScriptedClientConfig(replies=["ok"]))
        self.gate = asyncio.Event()

    async def generate(self, messages: list[Message], sampling: SamplingArgs, **kwargs: Any) -> ModelResponse:
        await self.gate.wait()
        return await super().generate(messages, sampling, **kwargs)


def test_calls_waiting_past_the_queue_bound_are_429() -> None:
    async def main() -> None:
        proxy = ChatProxy()
        await proxy.start()
        try:
            client = GatedClient()
            session = proxy.open(SESSION, client, SamplingArgs(max_tokens=8))
            url = proxy.session_url(SESSION) + "/chat/completions"
            body = json.dumps(HELLO).encode()
            calls = [asyncio.create_task(post(url, body)) for _ in range(MAX_WAITING + 4)]
            while session.refused < 3:  # one in flight, MAX_WAITING behind it, the rest refused at once
                await asyncio.sleep(0.01)
            assert session.waiting == MAX_WAITING
            client.gate.set()
            statuses = [s for s, _ in await asyncio.gather(*calls)]
            assert statuses.count(200) == MAX_WAITING + 1 and statuses.count(429) == 3, statuses
        finally:
            await proxy.stop()

    asyncio.run(main())


def test_the_proxy_listens_on_loopback_only() -> None:
    async def main() -> None:
        async with proxy_session() as (proxy, _, _):
            with socket.socket() as probe:
                probe.settimeout(2)
                assert probe.connect_ex(("127.0.0.2", proxy.port)) != 0

    asyncio.run(main())
