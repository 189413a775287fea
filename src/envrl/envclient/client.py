"""`EnvClient`: every call ends, with its result or an `EnvServerError` (an error answer, a bad response, its
deadline, or a dead server, which fails every pending call at once); `at_capacity` is retried with backoff; cancel
sends `cancel`."""

from __future__ import annotations

import asyncio
import itertools
import random
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq
import zmq.auth
from loguru import logger
from pydantic import BaseModel

from envrl.data.traces import Trace
from envrl.model.client import SamplingArgs
from envrl.serve import protocol as p
from envrl.serve.config import CurveClientConfig, load_secret_certificate
from envrl.serve.zmqio import Frames, SocketPump

UNAVAILABLE = "unavailable"
"""EnvServerError type: the server is dead or unreachable (client-side; never sent by a server)."""
TIMEOUT = "timeout"
"""EnvServerError type: the call's own deadline passed (client-side)."""
BAD_RESPONSE = "bad_response"
"""EnvServerError type: the server's answer is not a response of this protocol version (client-side)."""
FIRST_BACKOFF = 0.02
"""Seconds before the first retry of an `at_capacity` answer; doubled per retry up to `max_backoff`,
each pause drawn between half and all of it."""
TICK = 0.1
"""Seconds between checks of call deadlines and server silence (one sweep, not a timer per call)."""


class EnvServerError(RuntimeError):
    """A call that failed; `type` is a protocol error type, `unavailable`, `timeout` or `bad_response`."""

    def __init__(self, type: str, message: str, address: str, request_id: str | None = None) -> None:
        where = f"env server {address}" + (f" request {request_id}" if request_id else "")
        super().__init__(f"{where}: {type}: {message}")
        self.type = type
        self.request_id = request_id


class EnvClient:
    """Async client of the env server at `address`; use inside one event loop, close when done.

    `timeout` is the default deadline of a rollout call (None: wait as long as the
    server is alive); `health_interval` and `dead_after` set how fast a dead server is noticed.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float | None = None,
        health_interval: float = 1.0,
        dead_after: float = 3.0,
        curve: CurveClientConfig | None = None,
        max_backoff: float = 2.0,
        capacity_wait: float | None = None,
        on_at_capacity: Callable[[], None] | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.health_interval = health_interval
        self.dead_after = dead_after
        self.curve = curve
        self.max_backoff = max_backoff
        self.capacity_wait = capacity_wait
        """Most seconds one call keeps retrying `at_capacity` answers (None: until its own deadline)."""
        self.on_at_capacity = on_at_capacity
        """Called at each `at_capacity` answer that is retried (the orchestrator counts them)."""
        self._ids = itertools.count()
        self._prefix = secrets.token_hex(3)
        self._pending: dict[str, asyncio.Future[p.Response]] = {}
        self._deadlines: dict[str, tuple[float, str, float]] = {}
        """Request id -> (deadline, method, timeout) of calls that have one."""
        self._down: str | None = None
        self._started = False

    # -- lifecycle --------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._context = zmq.Context.instance()
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if self.curve is not None:
            server_public, _ = zmq.auth.load_certificate(self.curve.server_public_key_file)
            public, secret = load_secret_certificate(self.curve.secret_key_file, "curve.secret_key_file")
            socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = server_public, public, secret
        monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        socket.connect(self.address)
        self._pump = SocketPump(socket, self._on_messages, on_unsent=self._on_unsent, single_frame=True)
        self._monitor_pump = SocketPump(monitor, self._on_disconnect)
        self._last_heard = self._loop.time()
        self._watch = self._loop.create_task(self._watch_health())

    async def __aenter__(self) -> EnvClient:
        self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Fail pending calls, stop health probes, close the socket."""
        if not self._started:
            return
        self._fail_pending(EnvServerError(UNAVAILABLE, "the client was closed", self.address))
        self._watch.cancel()
        await asyncio.gather(self._watch, return_exceptions=True)
        self._pump.socket.disable_monitor()
        self._monitor_pump.close()
        self._pump.close()
        self._started = False

    # -- the methods ------------------------------------------------------------------------------

    async def health(self, timeout: float = 5.0) -> p.HealthResult:
        return p.HealthResult.model_validate(await self._call("health", {}, timeout, check_down=False))

    async def info(self, timeout: float = 5.0) -> p.ServerInfo:
        return p.ServerInfo.model_validate(await self._call("info", {}, timeout))

    async def run(
        self,
        task_idx: int,
        *,
        n: int = 1,
        sampling: SamplingArgs | Mapping[str, Any],
        split: p.Split = "train",
        seed: int | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> list[Trace]:
        """`n` rollouts of task `task_idx` with the server's model client, scored together (rollout i
        samples with seed + i); env failures come back as Traces with `error` set."""
        params = {"task_idx": task_idx, "split": split, "n": n, "sampling": _wire(sampling), "seed": seed}
        result = await self._call("run", params, timeout or self.timeout, request_id=request_id)
        return p.RunResult.model_validate(result).traces

    async def cancel(self, request_id: str, timeout: float = 5.0) -> bool:
        """Cancel an earlier request of this client; True if it was still queued or running."""
        params = p.CancelParams(request_id=request_id).model_dump()
        return p.CancelResult.model_validate(await self._call("cancel", params, timeout)).cancelled

    async def wait_until_ready(self, timeout: float) -> p.ServerInfo:
        """Wait until the server answers health with `ok` (a worker is ready); return its info."""
        self._start()
        deadline = self._loop.time() + timeout
        last = "no answer"
        while True:
            left = deadline - self._loop.time()
            if left <= 0:
                raise EnvServerError(TIMEOUT, f"not ready after {timeout:g} s (last health: {last})", self.address)
            try:
                health = await self.health(timeout=min(left, 1.0))
                if health.status == "ok":
                    return await self.info(timeout=max(left, 1.0))
                last = health.status
            except EnvServerError as e:
                last = str(e)
            await asyncio.sleep(min(0.05, max(0.0, deadline - self._loop.time())))

    # -- plumbing ---------------------------------------------------------------------------------

    async def _call(
        self,
        method: p.Method,
        params: dict[str, Any],
        timeout: float | None,
        *,
        check_down: bool = True,
        request_id: str | None = None,
    ) -> Any:
        self._start()
        deadline = None if timeout is None else self._loop.time() + timeout
        capacity_deadline = None if self.capacity_wait is None else self._loop.time() + self.capacity_wait
        backoff = FIRST_BACKOFF
        while True:
            if check_down and self._down is not None:
                raise EnvServerError(UNAVAILABLE, self._down, self.address)
            rid = request_id or f"{self._prefix}-{next(self._ids)}"
            future: asyncio.Future[p.Response] = self._loop.create_future()
            self._pending[rid] = future
            if deadline is not None:
                self._deadlines[rid] = (deadline, method, timeout)  # type: ignore[assignment]
            try:
                self._send(p.RequestMessage(id=rid, method=method, params=params))
                response = await future
            except asyncio.CancelledError:
                self._send_cancel(rid, method)
                raise
            finally:
                self._pending.pop(rid, None)
                self._deadlines.pop(rid, None)
            if isinstance(response, p.OkResponse):
                return response.result
            error = response.error
            # Jittered: clients turned away together do not all come back at the same instant.
            pause = backoff * random.uniform(0.5, 1.0)
            if error.type == p.AT_CAPACITY and all(
                end is None or self._loop.time() + pause < end for end in (deadline, capacity_deadline)
            ):
                if self.on_at_capacity is not None:
                    self.on_at_capacity()
                await asyncio.sleep(pause)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            raise EnvServerError(error.type, error.message, self.address, rid)

    def _send(self, message: p.RequestMessage) -> None:
        self._pump.send_message([p.encode(message.model_dump())])

    def _on_unsent(self, frames: Sequence[bytes]) -> None:
        """ZMQ had no connection to queue a request on (refused, or between reconnects): fail it."""
        future = self._pending.get(p.RequestMessage.model_validate(p.decode(frames[0])).id)
        if future is not None and not future.done():
            future.set_exception(
                EnvServerError(UNAVAILABLE, "not connected to the server (it refused us or is gone)", self.address)
            )

    def _send_cancel(self, rid: str, method: str) -> None:
        if method == "run" and not self._pump.socket.closed:
            params = p.CancelParams(request_id=rid).model_dump()
            self._send(p.RequestMessage(id=f"{self._prefix}-{next(self._ids)}", method="cancel", params=params))

    def _on_messages(self, batch: list[bytes]) -> None:
        self._last_heard = self._loop.time()
        if self._down is not None:
            logger.info(f"env server {self.address} answers again")
            self._down = None
        pending, decode = self._pending, p.decode_response
        for frame in batch:
            try:
                response = decode(frame)
            except Exception as e:
                self._on_bad_response(frame, e)
                continue
            future = pending.get(response.id) if response.id is not None else None
            if future is not None and not future.done():
                future.set_result(response)
            elif isinstance(response, p.ErrorResponse) and response.id is None:
                logger.warning(f"env server {self.address} reported a protocol error: {response.error}")

    def _on_bad_response(self, frame: bytes, error: Exception) -> None:
        """Fail the call a frame that is no response of this protocol version answers, if its id can be read;
        else drop it. Either way it is logged."""
        what = f"{type(error).__name__}: {error}".splitlines()[0]
        try:
            request_id = p.decode(frame).get("id")
            future = self._pending.get(request_id) if isinstance(request_id, str) else None
        except Exception:
            future = None
        if future is None or future.done():
            logger.warning(f"env server {self.address} sent an unreadable frame ({what}); dropped")
            return
        message = (
            f"the server's answer is not a protocol v{p.PROTOCOL_VERSION} response ({what}); is it another version?"
        )
        logger.warning(f"env server {self.address} request {request_id}: {message}")
        future.set_exception(EnvServerError(BAD_RESPONSE, message, self.address, request_id))

    def _on_disconnect(self, batch: list[Frames]) -> None:
        self._mark_down(f"the connection to the server dropped ({len(self._pending)} pending requests failed)")

    async def _watch_health(self) -> None:
        """Expire overdue calls; probe health when the server has been quiet; declare it dead
        after `dead_after` s of silence."""
        last_probe = self._loop.time()
        while True:
            await asyncio.sleep(TICK)
            now = self._loop.time()
            self._expire(now)
            silent = now - self._last_heard
            if silent >= self.dead_after and self._down is None:
                self._mark_down(
                    f"no answer for {silent:.1f} s, not even to health probes ({len(self._pending)} pending requests failed)"
                )
            if silent >= self.health_interval and now - last_probe >= self.health_interval:
                last_probe = now
                self._send(p.RequestMessage(id=f"{self._prefix}-h{next(self._ids)}", method="health"))

    def _expire(self, now: float) -> None:
        for rid, (deadline, method, timeout) in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[rid]
                future = self._pending.get(rid)
                if future is not None and not future.done():
                    future.set_exception(
                        EnvServerError(TIMEOUT, f"{method} got no answer within {timeout:g} s", self.address, rid)
                    )
                    self._send_cancel(rid, method)

    def _mark_down(self, reason: str) -> None:
        if self._down is None:
            logger.warning(f"env server {self.address} is unavailable: {reason}")
        self._down = f"env server unavailable: {reason}"
        self._last_heard = self._loop.time()  # probing starts over
        self._fail_pending(EnvServerError(UNAVAILABLE, reason, self.address))

    def _fail_pending(self, error: EnvServerError) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()


def _wire(value: BaseModel | Mapping[str, Any]) -> Any:
    """A params field as sent: a model dumped, a map as it is (the server checks both)."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value
