"""Lean ZMQ I/O: every message on a `SocketPump`'s socket reaches `on_messages` in order, batched, none missed by
the edge-triggered fd; `send`s leave together, in order, at the end of the loop turn (numbers:
docs/measurements.md)."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from zmq.backend import Socket as _RawSocket

Frames = list[bytes]

NOBLOCK = int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)
RCVMORE = int(zmq.RCVMORE)
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
MAX_BATCH = 4096
"""Most messages read from one socket per loop turn, so neither side starves the other."""
SMALL_BATCH = 4
"""Messages read with an EVENTS check after each; beyond, reads go on until zmq.Again, which costs
more once than an EVENTS check but less than many of them."""
raw_send: Callable[..., Any] = _RawSocket.send
"""`raw_send(socket, frame, flags)`: send one frame, no Python-level wrapper."""
raw_recv: Callable[..., bytes] = _RawSocket.recv
"""`raw_recv(socket, flags)`: receive one frame as bytes."""
raw_get: Callable[..., Any] = _RawSocket.get
"""`raw_get(socket, option)`: a socket option (RCVMORE after a frame: more frames follow)."""


def send_frames(socket: zmq.Socket[bytes], frames: Sequence[bytes]) -> None:
    """Send one message without blocking; raises zmq.Again (only ever before its first frame:
    ZMQ takes the rest of a message whose first frame it took)."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        raw_send(socket, frame, NOBLOCK | SNDMORE if i < last else NOBLOCK)


def recv_frames(socket: zmq.Socket[bytes]) -> Frames:
    """Receive one whole message without blocking; raises zmq.Again when none is waiting."""
    frames = [raw_recv(socket, NOBLOCK)]
    while raw_get(socket, RCVMORE):
        frames.append(raw_recv(socket, NOBLOCK))
    return frames


def recv_batch(socket: zmq.Socket[bytes], limit: int, single_frame: bool = False) -> list[Any]:
    """Up to `limit` waiting messages (frame lists, or with `single_frame` one frame each), without
    blocking. Checks EVENTS while the batch is small: raising zmq.Again costs more than a check,
    and a poll turn usually finds one or two messages (or none, after a send reset the fd)."""
    batch: list[Any] = []
    if not raw_get(socket, EVENTS) & POLLIN:
        return batch
    append = batch.append
    try:
        while len(batch) < limit:
            append(raw_recv(socket, NOBLOCK) if single_frame else recv_frames(socket))
            if len(batch) < SMALL_BATCH and not raw_get(socket, EVENTS) & POLLIN:
                break
    except zmq.Again:
        pass
    return batch


class SocketPump:
    """Reads `socket` from the running loop and writes it in bursts; never blocks.

    `on_messages` gets a list of messages, each a list of frames, or with `single_frame` each one
    frame (bytes): a socket whose peer sends one-frame messages skips the more-frames check.
    `on_flush`, if given, is called before each burst so its owner can add batched messages;
    `wake` asks for a burst without sending. A message ZMQ cannot take (no connection at all, for
    a DEALER) goes to `on_unsent`.
    """

    def __init__(
        self,
        socket: zmq.Socket[bytes],
        on_messages: Callable[[list[Any]], None],
        on_unsent: Callable[[Sequence[bytes]], None] | None = None,
        max_batch: int = MAX_BATCH,
        *,
        single_frame: bool = False,
        on_flush: Callable[[], None] | None = None,
    ) -> None:
        self.socket = socket
        self.on_messages = on_messages
        self.on_unsent = on_unsent
        self.on_flush = on_flush
        self.max_batch = max_batch
        self.single_frame = single_frame
        self.loop = asyncio.get_running_loop()
        self._outbox: list[Sequence[bytes]] = []
        self._scheduled = False
        self._fd = socket.getsockopt(zmq.FD)
        self.loop.add_reader(self._fd, self._drain)
        self.wake()

    def send_message(self, frames: Sequence[bytes]) -> None:
        self._outbox.append(frames)
        if not self._scheduled:
            self.wake()

    def close(self, linger_ms: int = 0) -> None:
        self.flush()
        self.loop.remove_reader(self._fd)
        self.socket.close(linger=linger_ms)

    def flush(self) -> None:
        if self.on_flush is not None:
            self.on_flush()
        outbox, self._outbox = self._outbox, []
        socket = self.socket
        for frames in outbox:
            if socket.closed:
                return
            try:
                if len(frames) == 1:
                    raw_send(socket, frames[0], NOBLOCK)
                else:
                    send_frames(socket, frames)
            except zmq.Again:
                if self.on_unsent is not None:
                    self.on_unsent(frames)

    def wake(self) -> None:
        """Flush and read at the end of this loop iteration."""
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        socket = self.socket
        if socket.closed:
            self._scheduled = False
            return
        self.flush()
        self._scheduled = False  # only now: what on_flush sent has just left
        batch = recv_batch(socket, self.max_batch, self.single_frame)
        if len(batch) == self.max_batch:
            self.wake()  # more may be waiting: let other callbacks run first
        if batch:
            self.on_messages(batch)


class StopSignals:
    """SIGTERM and SIGINT, delivered to a poll loop through a wakeup fd instead of interrupting it.

    Register `fd` for POLLIN; when it fires, `received()` names the signals that arrived.
    """

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self.fd = self._read.fileno()
        signal.set_wakeup_fd(self._write.fileno())
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)  # the wakeup fd carries the signal number

    def received(self) -> list[str]:
        try:
            numbers = self._read.recv(64)
        except BlockingIOError:
            return []
        # the wakeup fd carries every signal with a Python handler (SIGUSR1: a stack dump, runtime/stacks.py)
        return [signal.Signals(n).name for n in numbers if n in (signal.SIGTERM, signal.SIGINT)]

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        self._read.close()
        self._write.close()
