"""The host side of a sandbox's way to chosen host loopback ports: it reaches exactly the allowed ports, only its
own uid may connect, and relays and unanswered bytes are capped per sandbox and per worker (docs/sandbox.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path

from loguru import logger

from envrl.sandbox.user_dirs import owned_dir
from envrl.telemetry.log import Throttle

MOUNT = "/run/envrl-bridge"
"""Where a sandbox sees its bridge directory."""
SOCKET = "bridge.sock"
HEADER_TIMEOUT_S = 10.0
"""How long a connection may take to name its port."""
MIB = 1 << 20
RELAYS_PER_SANDBOX = 16
"""Connections one sandbox may have relayed at once (a harness, its tool servers, a few spare)."""
RELAYS_PER_WORKER = 256
"""Connections all sandboxes of this process may have relayed at once (3 fds each)."""
SANDBOX_BUDGET = 4 * MIB
"""Unanswered bytes one sandbox's connections may have sent the host (the largest request)."""
WORKER_BUDGET = 64 * MIB
"""Unanswered bytes all sandboxes of this process may have sent the host."""
CHUNK = 1 << 16
"""Bytes relayed per read (so a relay holds at most this much in hand per direction)."""


def bridges_root() -> Path:
    """The per-user parent of bridge directories: ours, mode 0711 (reachable, not listable), checked."""
    path = Path(tempfile.gettempdir()) / f"envrl-bridges-{os.getuid()}"
    return owned_dir(path, 0o711, refuse=0o022, what="sandbox bridge directory", fix="remove it")


def directory_of(uid: int) -> Path:
    return bridges_root() / str(uid)


def remove(uid: int) -> None:
    """Remove a sandbox's bridge directory (its owner closed it, or died)."""
    shutil.rmtree(directory_of(uid), ignore_errors=True)


class Budget:
    """Relays and unanswered bytes under a cap of each, inside a parent's (a sandbox's inside the worker's)."""

    def __init__(self, relays: int, budget: int, parent: Budget | None = None) -> None:
        self.max_relays, self.budget, self.parent = relays, budget, parent
        self.relays = 0
        self.unanswered = 0
        self.waiters: set[asyncio.Event] = set()
        """Admissions waiting for room (kept at the chain's root)."""

    def _chain(self) -> list[Budget]:
        return [self] if self.parent is None else [self, *self.parent._chain()]

    def admit(self) -> bool:
        """One more relay, if every cap in the chain has room."""
        chain = self._chain()
        if any(b.relays >= b.max_relays for b in chain):
            return False
        for b in chain:
            b.relays += 1
        return True

    async def enter(self) -> None:
        """One more relay, once every cap in the chain has room (a relay ending anywhere in the
        chain's root wakes the waiters to try again)."""
        root = self._chain()[-1]
        while not self.admit():
            freed = asyncio.Event()
            root.waiters.add(freed)
            try:
                await freed.wait()
            finally:
                root.waiters.discard(freed)

    def release(self, unanswered: int) -> None:
        """A relay ended with `unanswered` bytes still counted."""
        chain = self._chain()
        for b in chain:
            b.relays -= 1
            b.unanswered -= unanswered
        for freed in chain[-1].waiters:
            freed.set()

    def take(self, n: int) -> bool:
        """Count `n` more unanswered bytes, if every budget in the chain has room."""
        chain = self._chain()
        if any(b.unanswered + n > b.budget for b in chain):
            return False
        for b in chain:
            b.unanswered += n
        return True

    def answered(self, n: int) -> None:
        for b in self._chain():
            b.unanswered -= n


WORKER = Budget(RELAYS_PER_WORKER, WORKER_BUDGET)
"""This process's caps, shared by every sandbox it runs."""
_refusals = Throttle()


def _refused(uid: int, what: str) -> None:
    more = _refusals.suffix()
    if more is not None:
        logger.warning(f"sandbox uid {uid}: {what}{more}")


class HostBridge:
    """One sandbox's bridge: created empty before the sandbox starts, listening once a port is allowed."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.directory = directory_of(uid)
        remove(uid)  # a stale one of a dead owner with this uid
        self.directory.mkdir(mode=0o755)
        self.allowed: set[int] = set()
        self._accepter: asyncio.Task[None] | None = None
        self._relays: set[asyncio.Task[None]] = set()
        self.budget = Budget(RELAYS_PER_SANDBOX, SANDBOX_BUDGET, WORKER)
        self.refused = 0
        """Connections closed for a cap or a budget."""

    @property
    def socket_in_sandbox(self) -> str:
        return f"{MOUNT}/{SOCKET}"

    async def allow(self, ports: Iterable[int]) -> None:
        if self._accepter is None:
            path = self.directory / SOCKET
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            os.chown(path, self.uid, self.uid)
            path.chmod(0o600)
            listener.listen(RELAYS_PER_SANDBOX)
            listener.setblocking(False)
            self._accepter = asyncio.create_task(self._accept(listener))
        self.allowed |= set(ports)

    async def _accept(self, listener: socket.socket) -> None:
        """Accept a connection only when the caps have room for its relay: until then the sandbox's
        connections wait in the kernel's backlog (bounded by `listen`), costing the worker no fd."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self.budget.enter()
                try:
                    conn, _ = await loop.sock_accept(listener)
                except BaseException:
                    self.budget.release(0)
                    raise
                task = asyncio.create_task(self._serve(conn))
                self._relays.add(task)
                task.add_done_callback(self._relays.discard)
        finally:
            listener.close()

    async def _serve(self, conn: socket.socket) -> None:
        relay: _Relay | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=CHUNK)
            relay = _Relay(self, writer)
            await self._relay(reader, relay)
        except OSError:
            pass
        finally:
            self.budget.release(relay.unanswered if relay is not None else 0)
            if relay is not None:
                with contextlib.suppress(OSError):
                    relay.writer.close()
            else:
                conn.close()

    async def _relay(self, reader: asyncio.StreamReader, relay: _Relay) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), HEADER_TIMEOUT_S)
            port = int(line.strip()) if line.strip().isdigit() and len(line) <= 8 else -1
        except (TimeoutError, ValueError, OSError):
            return
        if port not in self.allowed:
            _refused(self.uid, f"refused a connection to host port {port} (allowed: {sorted(self.allowed)})")
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        try:
            await asyncio.gather(relay.up(reader, up_writer), relay.down(up_reader))
        finally:
            with contextlib.suppress(OSError):
                up_writer.close()

    async def close(self) -> None:
        if self._accepter is not None:
            self._accepter.cancel()
            self._accepter = None
        for task in list(self._relays):
            task.cancel()
        remove(self.uid)


class _Relay:
    """One relayed connection: the sandbox's end, and the bytes it sent that the host has not answered."""

    def __init__(self, bridge: HostBridge, writer: asyncio.StreamWriter) -> None:
        self.bridge = bridge
        self.writer = writer
        self.unanswered = 0

    async def up(self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        """Sandbox -> host, within the budgets; past one the connection is closed, the bytes dropped."""
        try:
            while data := await reader.read(CHUNK):
                if not self.bridge.budget.take(len(data)):
                    self.bridge.refused += 1
                    _refused(
                        self.bridge.uid, f"closed a connection past its budget of {SANDBOX_BUDGET} unanswered bytes"
                    )
                    self.writer.transport.abort()
                    up_writer.transport.abort()
                    return
                self.unanswered += len(data)
                up_writer.write(data)
                await up_writer.drain()
            if up_writer.can_write_eof():
                up_writer.write_eof()
        except OSError:
            pass

    async def down(self, up_reader: asyncio.StreamReader) -> None:
        """Host -> sandbox: whatever the host sends answers what the sandbox sent so far."""
        try:
            while data := await up_reader.read(CHUNK):
                self.bridge.budget.answered(self.unanswered)
                self.unanswered = 0
                self.writer.write(data)
                await self.writer.drain()
            if self.writer.can_write_eof():
                self.writer.write_eof()
        except OSError:
            pass
