"""The host's end of the agent protocol: pipes only the agent holds, and `AgentChannel.call` returns only an answer
echoing its request's sequence and fresh nonce; anything else raises `SandboxProtocolError`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import struct
from typing import Any

from envrl.sandbox.errors import SandboxProtocolError

MAX_FRAME = 64 << 20
HEADER = struct.Struct(">I")


class AgentPipes:
    """The ends of the two protocol pipes and of bubblewrap's stderr: the sandbox's protocol ends
    go to bubblewrap as `pass_fds`, `stderr_out` as its stderr (read until the agent is ready)."""

    def __init__(self) -> None:
        self.requests_in, self.requests_out = os.pipe()  # host writes out, agent reads in
        self.answers_in, self.answers_out = os.pipe()  # agent writes out, host reads in
        self.stderr_in, self.stderr_out = os.pipe()
        os.set_inheritable(self.requests_in, True)
        os.set_inheritable(self.answers_out, True)

    @property
    def sandbox_fds(self) -> tuple[int, int]:
        """(requests, answers): the agent's ends, passed to bubblewrap and named on the agent's argv."""
        return self.requests_in, self.answers_out

    def close_sandbox_ends(self) -> None:
        """After the spawn: the host keeps only its own ends, so the agent's exit is EOF here."""
        for fd in (*self.sandbox_fds, self.stderr_out):
            os.close(fd)

    def close_all(self) -> None:
        """Close every end (a spawn that failed)."""
        ends = (self.requests_in, self.requests_out, self.answers_in, self.answers_out, self.stderr_in, self.stderr_out)
        for fd in ends:
            with contextlib.suppress(OSError):
                os.close(fd)


async def read_end(fd: int) -> tuple[asyncio.StreamReader, asyncio.ReadTransport]:
    """A pipe's read end `fd` as a stream (at most `MAX_FRAME` bytes buffered) and its transport."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_FRAME, loop=loop)
    pipe = open(fd, "rb", 0)  # noqa: SIM115 - the transport owns it
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader, transport


class AgentChannel:
    """The host's two ends, as asyncio transports; `call` one request at a time (the caller locks)."""

    def __init__(
        self, reader: asyncio.StreamReader, read: asyncio.ReadTransport, writer: asyncio.WriteTransport
    ) -> None:
        self._reader = reader
        self._read = read
        self._writer = writer
        self._sequence = 0

    @classmethod
    async def open(cls, pipes: AgentPipes) -> AgentChannel:
        reader, read = await read_end(pipes.answers_in)
        pipe = open(pipes.requests_out, "wb", 0)  # noqa: SIM115 - the transport owns it
        writer, _ = await asyncio.get_running_loop().connect_write_pipe(asyncio.Protocol, pipe)
        return cls(reader, read, writer)

    async def ready(self) -> dict[str, Any]:
        """The agent's first frame (its ready line: sent before any code of the sandbox runs)."""
        return await self._frame()

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send `request`, return its answer without the echo; `asyncio.IncompleteReadError` when
        the agent is gone, `SandboxProtocolError` for any frame that is not this request's answer."""
        self._sequence += 1
        echo = {"seq": self._sequence, "nonce": secrets.token_hex(16)}
        body = json.dumps({**request, **echo}).encode()
        self._writer.write(HEADER.pack(len(body)) + body)
        answer = await self._frame()
        got = {key: answer.pop(key, None) for key in echo}
        if got != echo:
            seen = {key: got[key] for key in got if key != "nonce"}
            raise SandboxProtocolError(
                f"an answer frame did not echo request {echo['seq']}'s nonce and sequence number (it said "
                f"{seen}, nonce {'matching' if got['nonce'] == echo['nonce'] else 'wrong'}): forged by code in "
                "the sandbox or out of step; the sandbox is killed and nothing in the frame is used"
            )
        return answer

    async def _frame(self) -> dict[str, Any]:
        (size,) = HEADER.unpack(await self._reader.readexactly(HEADER.size))
        if size > MAX_FRAME:
            raise SandboxProtocolError(f"the agent's answer pipe announced a {size}-byte frame (limit {MAX_FRAME})")
        body = await self._reader.readexactly(size)
        try:
            frame = json.loads(body)
        except ValueError:
            frame = None
        if not isinstance(frame, dict):
            raise SandboxProtocolError(f"a frame on the agent's answer pipe is not a JSON object: {body[:80]!r}")
        return frame

    def close(self) -> None:
        self._writer.close()
        self._read.close()
