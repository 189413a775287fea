"""The in-memory transfer's rendezvous: nothing is read or written until both ends prove the policy's secret (HMAC
over fresh nonces); bounded by keys, bytes and pending handshakes; a `torch.distributed.Store` without pickles."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Sequence

import torch.distributed as dist
from loguru import logger

SECRET_BYTES = 16
MAGIC = b"envrl-rendezvous/1"
NONCE_BYTES = 16
PROOF_BYTES = 32
HELLO = len(MAGIC) + NONCE_BYTES
CLIENT_PROOF = NONCE_BYTES + PROOF_BYTES
HANDSHAKE_S = 5.0
"""An unproven connection is closed after this long."""
MAX_UNPROVEN = 64
"""Unproven connections held at once; a new one drops the oldest."""
MAX_KEY_BYTES = 256
MAX_VALUE_BYTES = 64 * 2**10
MAX_STORED_BYTES = 4 * 2**20
"""Keys and values of proven clients, all together (a gloo group stores ~200 bytes per rank)."""
HEADER = struct.Struct("!BII")
SET, GET, ADD, CHECK = 1, 2, 3, 4
CONNECT_TIMEOUT_S = 10.0
"""How long a client tries to reach the server: a dead sender is not waited for."""


class RendezvousError(RuntimeError):
    """The rendezvous could not be joined or used; the message says where and why."""


def new_secret() -> str:
    """A fresh per-policy secret: 128 bits, hex."""
    return secrets.token_hex(SECRET_BYTES)


def _proof(secret: str, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(bytes.fromhex(secret), role + server_nonce + client_nonce, hashlib.sha256).digest()


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self.proven = False
        self.opened = time.monotonic()
        self.buffer = bytearray()


class RendezvousServer:
    """The store of one policy's transfer, served from a thread on `host` (port picked)."""

    def __init__(self, host: str, secret: str) -> None:
        self.secret = secret
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family)
        self._listener.setblocking(False)
        self.host, self.port = host, self._listener.getsockname()[1]
        self._data: dict[bytes, bytes] = {}
        self._stored = 0
        self._waiting: dict[bytes, list[_Conn]] = {}
        self._changed = threading.Condition()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"rendezvous-{self.port}", daemon=True)
        self._thread.start()

    def wait_for(self, key: str, timeout_s: float) -> bytes | None:
        """The value a proven client set under `key`, waiting up to `timeout_s` (None: not set,
        or the server closed)."""
        with self._changed:
            self._changed.wait_for(lambda: key.encode() in self._data or self._closed, timeout_s)
            return self._data.get(key.encode())

    def close(self) -> None:
        """Stop serving and close every connection (idempotent)."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            self._changed.notify_all()
        self._wake_w.send(b"x")
        self._thread.join(10)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()
        self._wake_w.close()

    def _run(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=1.0):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is not self._wake_r:
                    self._read(key.data)
            now = time.monotonic()
            for conn in self._unproven():
                if now - conn.opened > HANDSHAKE_S:
                    self._drop(conn)

    def _unproven(self) -> list[_Conn]:
        conns = [k.data for k in self._selector.get_map().values() if isinstance(k.data, _Conn)]
        return sorted((c for c in conns if not c.proven), key=lambda c: c.opened)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        if len(unproven := self._unproven()) >= MAX_UNPROVEN:
            self._drop(unproven[0])
        conn = _Conn(sock)
        try:
            sock.sendall(MAGIC + conn.nonce)  # a few bytes into an empty socket buffer: never blocks
        except OSError:
            sock.close()
            return
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: _Conn) -> None:
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):  # dropped already
            return
        conn.sock.close()
        for waiters in self._waiting.values():
            if conn in waiters:
                waiters.remove(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(HEADER.size + MAX_KEY_BYTES + MAX_VALUE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        conn.buffer += chunk
        if not conn.proven:
            if len(conn.buffer) < CLIENT_PROOF:
                return
            client_nonce, proof = bytes(conn.buffer[:NONCE_BYTES]), bytes(conn.buffer[NONCE_BYTES:CLIENT_PROOF])
            if len(conn.buffer) > CLIENT_PROOF or not hmac.compare_digest(
                proof, _proof(self.secret, b"client", conn.nonce, client_nonce)
            ):
                logger.warning(f"weight-transfer rendezvous on {self.host}:{self.port}: a client without the secret")
                self._drop(conn)
                return
            conn.proven, conn.buffer = True, bytearray()
            self._answer(conn, _proof(self.secret, b"server", conn.nonce, client_nonce))
        while conn.proven and len(conn.buffer) >= HEADER.size:
            op, key_len, value_len = HEADER.unpack_from(conn.buffer)
            if key_len > MAX_KEY_BYTES or value_len > MAX_VALUE_BYTES:
                logger.warning(f"weight-transfer rendezvous: a {key_len}/{value_len}-byte key/value refused")
                self._drop(conn)
                return
            end = HEADER.size + key_len + value_len
            if len(conn.buffer) < end:
                return
            key, value = (
                bytes(conn.buffer[HEADER.size : HEADER.size + key_len]),
                bytes(conn.buffer[HEADER.size + key_len : end]),
            )
            del conn.buffer[:end]
            if not self._serve(conn, op, key, value):
                self._drop(conn)
                return

    def _serve(self, conn: _Conn, op: int, key: bytes, value: bytes) -> bool:
        if op == GET:
            if key in self._data:
                self._answer(conn, self._data[key])
            else:
                self._waiting.setdefault(key, []).append(conn)
            return True
        if op == CHECK:
            self._answer(conn, b"1" if key in self._data else b"0")
            return True
        if op == ADD:
            try:
                value = str(int(self._data.get(key, b"0")) + int(value)).encode()
            except ValueError:
                return False
        elif op != SET:
            return False
        grown = len(key) + len(value) - (len(key) + len(self._data[key]) if key in self._data else 0)
        if self._stored + grown > MAX_STORED_BYTES:
            logger.warning(f"weight-transfer rendezvous: store full ({MAX_STORED_BYTES} bytes), a client dropped")
            return False
        with self._changed:
            self._data[key] = value
            self._stored += grown
            self._changed.notify_all()
        if op == ADD:
            self._answer(conn, value)
        else:
            self._answer(conn, b"")
        for waiter in self._waiting.pop(key, []):
            self._answer(waiter, value)
        return True

    def _answer(self, conn: _Conn, payload: bytes) -> None:
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(HANDSHAKE_S)
            conn.sock.sendall(struct.pack("!I", len(payload)) + payload)
            conn.sock.setblocking(False)
        except OSError:
            self._drop(conn)


class RendezvousStore(dist.Store):
    """A client of a `RendezvousServer`, as a `torch.distributed.Store`: connects (for up to
    `connect_timeout_s`), proves the secret and has the server prove it; every later call waits
    up to `timeout_s`."""

    def __init__(
        self, host: str, port: int, secret: str, timeout_s: float, connect_timeout_s: float = CONNECT_TIMEOUT_S
    ) -> None:
        super().__init__()
        self._where = f"the weight-transfer rendezvous at {host}:{port}"
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._sock = self._connect(host, port, connect_timeout_s)
        try:
            self._handshake(secret, connect_timeout_s)
        except BaseException:
            self._sock.close()
            raise
        self._sock.settimeout(timeout_s)

    def _connect(self, host: str, port: int, connect_timeout_s: float) -> socket.socket:
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                return socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.1))
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise RendezvousError(
                        f"{self._where} did not answer within {connect_timeout_s:g} s ({e}): the trainer that "
                        "published this policy is gone; load a newer one"
                    ) from None
                time.sleep(0.2)

    def _handshake(self, secret: str, timeout_s: float) -> None:
        self._sock.settimeout(timeout_s)
        try:
            hello = self._exactly(HELLO)
            if not hello.startswith(MAGIC):
                raise RendezvousError(f"{self._where} is not an envrl weight-transfer sender: refused")
            server_nonce, client_nonce = hello[len(MAGIC) :], secrets.token_bytes(NONCE_BYTES)
            self._sock.sendall(client_nonce + _proof(secret, b"client", server_nonce, client_nonce))
            answer = self._exactly(4 + PROOF_BYTES)
        except (OSError, RendezvousError) as e:
            raise RendezvousError(
                f"{self._where} did not prove this policy's secret ({e}): refused (a process that took a dead "
                "sender's port, or a stale transfer.json)"
            ) from None
        if not hmac.compare_digest(answer[4:], _proof(secret, b"server", server_nonce, client_nonce)):
            raise RendezvousError(f"{self._where} did not prove this policy's secret: refused (an impostor sender)")

    def _exactly(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = self._sock.recv(n - len(data))
            if not chunk:
                raise RendezvousError(f"{self._where} closed the connection")
            data += chunk
        return bytes(data)

    def _call(self, op: int, key: str, value: bytes = b"") -> bytes:
        raw = key.encode()
        with self._lock:
            try:
                self._sock.sendall(HEADER.pack(op, len(raw), len(value)) + raw + value)
                (length,) = struct.unpack("!I", self._exactly(4))
                return self._exactly(length)
            except (OSError, RendezvousError) as e:
                raise RendezvousError(
                    f"{self._where}: {['set', 'get', 'add', 'check'][op - 1]} {key!r} failed: {e}"
                ) from None

    def set(self, key: str, value: bytes | str) -> None:
        self._call(SET, key, value if isinstance(value, bytes) else value.encode())

    def get(self, key: str) -> bytes:
        return self._call(GET, key)

    def add(self, key: str, amount: int) -> int:
        return int(self._call(ADD, key, str(amount).encode()))

    def check(self, keys: Sequence[str]) -> bool:
        return all(self._call(CHECK, key) == b"1" for key in keys)

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta | None = None) -> None:
        for key in keys:
            self.get(key)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout_s = timeout.total_seconds()
        self._sock.settimeout(self._timeout_s)

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self._timeout_s)

    def close(self) -> None:
        self._sock.close()
