"""The host side of a sandbox's way to chosen host loopback ports (a chat proxy, a tool server).

Guarantee: a sandbox with no network reaches exactly the host ports it was allowed, nothing
else. Its bridge is a unix socket in a host directory of its own, bound read-only into the
sandbox at `MOUNT`; only the sandbox's host uid (and root) may connect to it (owner and mode
0600), and each connection names a port on its first line: an allowed one is relayed to
`127.0.0.1:PORT` of the host, any other is closed. Inside, forwarder.py listens on the same
ports of the sandbox's own loopback, so URLs mean the same inside and out. `close()` stops the
relays and removes the directory; the reaper removes what a dead owner left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from loguru import logger

from envrl.sandbox.user_dirs import owned_dir

MOUNT = "/run/envrl-bridge"
"""Where a sandbox sees its bridge directory."""
SOCKET = "bridge.sock"
HEADER_TIMEOUT_S = 10.0
"""How long a connection may take to name its port."""


def bridges_root() -> Path:
    """The per-user parent of bridge directories: ours, mode 0711 (reachable, not listable), checked."""
    path = Path(tempfile.gettempdir()) / f"envrl-bridges-{os.getuid()}"
    return owned_dir(path, 0o711, refuse=0o022, what="sandbox bridge directory", fix="remove it")


def directory_of(uid: int) -> Path:
    return bridges_root() / str(uid)


def remove(uid: int) -> None:
    """Remove a sandbox's bridge directory (its owner closed it, or died)."""
    shutil.rmtree(directory_of(uid), ignore_errors=True)


class HostBridge:
    """One sandbox's bridge: created empty before the sandbox starts, listening once a port is allowed."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.directory = directory_of(uid)
        remove(uid)  # a stale one of a dead owner with this uid
        self.directory.mkdir(mode=0o755)
        self.allowed: set[int] = set()
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()

    @property
    def socket_in_sandbox(self) -> str:
        return f"{MOUNT}/{SOCKET}"

    async def allow(self, ports: Iterable[int]) -> None:
        if self._server is None:
            path = self.directory / SOCKET
            self._server = await asyncio.start_unix_server(self._accept, path=str(path))
            os.chown(path, self.uid, self.uid)
            path.chmod(0o600)
        self.allowed |= set(ports)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            await self._relay(reader, writer)
        finally:
            self._relays.discard(task)
            with contextlib.suppress(OSError):
                writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), HEADER_TIMEOUT_S)
            port = int(line.strip()) if line.strip().isdigit() and len(line) <= 8 else -1
        except (TimeoutError, ValueError, OSError):
            return
        if port not in self.allowed:
            logger.warning(
                f"sandbox uid {self.uid}: refused a connection to host port {port} (allowed: {self.allowed})"
            )
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            with contextlib.suppress(OSError):
                up_writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._relays):
            task.cancel()
        remove(self.uid)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass
