"""Answers over the ROUTER socket: a reading client gets its answers in order; one stalled past `stall_timeout` or
over `limit` is dropped and its requests cancelled, so memory per client stays within 2 x `limit` answers."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import zmq
from loguru import logger

from envrl.serve.zmqio import NOBLOCK, SNDMORE, raw_send


class ClientSender:
    def __init__(
        self, sock: zmq.Socket[bytes], limit: int, stall_timeout: float, on_dropped: Callable[[bytes], None]
    ) -> None:
        """`sock` is a ROUTER with ROUTER_MANDATORY set and SNDHWM = `limit`."""
        self.sock = sock
        self.limit = limit
        self.stall_timeout = stall_timeout
        self.on_dropped = on_dropped
        self.waiting: dict[bytes, deque[bytes]] = {}
        """Answers ZMQ would not take yet, by client identity, oldest first."""
        self.stalled_since: dict[bytes, float] = {}
        """When each waiting client last took an answer."""
        self.dropped: set[bytes] = set()

    def send_reply(self, identity: bytes, frame: bytes) -> None:
        if self.waiting:
            waiting = self.waiting.get(identity)
            if waiting is not None:  # behind earlier answers: keep the order
                waiting.append(frame)
                if len(waiting) > self.limit:
                    self._drop(
                        identity,
                        f"it does not read its answers ({len(waiting)} answers waiting on top of the {self.limit} queued in ZMQ)",
                    )
                return
        if identity in self.dropped:
            return
        try:
            self._send_now(identity, frame)
        except zmq.Again:
            self.waiting[identity] = deque([frame])
            self.stalled_since[identity] = time.monotonic()

    def received_from(self, identity: bytes) -> None:
        """A client that sends again after it was dropped is answered again."""
        if self.dropped:
            self.dropped.discard(identity)

    def retry(self, now: float) -> None:
        """Send what waits while ZMQ takes it; drop clients stalled past `stall_timeout`."""
        for identity, waiting in list(self.waiting.items()):
            try:
                while waiting and identity not in self.dropped:
                    self._send_now(identity, waiting[0])
                    waiting.popleft()
                    self.stalled_since[identity] = now
            except zmq.Again:
                if now - self.stalled_since[identity] > self.stall_timeout:
                    self._drop(
                        identity,
                        f"it does not read its answers (none taken for {self.stall_timeout:g} s, client_stall_timeout_s)",
                    )
                continue
            self.waiting.pop(identity, None)  # a client found gone was dropped (and popped) by `_send_now`
            self.stalled_since.pop(identity, None)

    def _send_now(self, identity: bytes, frame: bytes) -> None:
        """Raises zmq.Again when the client's queue is full; a client that is gone is dropped."""
        try:
            raw_send(self.sock, identity, NOBLOCK | SNDMORE)
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            if identity not in self.dropped:  # disconnected: nobody to answer, nobody to run its work for
                self._drop(identity, "its connection is closed", level="INFO")
            return
        raw_send(self.sock, frame, NOBLOCK)  # ZMQ takes the rest of a message whose first frame it took

    def _drop(self, identity: bytes, reason: str, level: str = "WARNING") -> None:
        waiting = self.waiting.pop(identity, ())
        self.stalled_since.pop(identity, None)
        self.dropped.add(identity)
        logger.log(
            level,
            f"dropping client {identity.hex()}: {reason}; "
            f"discarding {len(waiting)} waiting answers and cancelling its requests",
        )
        self.on_dropped(identity)
