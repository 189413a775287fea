"""The env server: every request gets exactly one response (a Trace, an error Trace, a re-run after a worker death,
or an error response); params are checked once here; a bad frame never stops the server (docs/protocol.md)."""

from __future__ import annotations

import time
from typing import Any

import zmq
from loguru import logger

from envrl.envs.environment import Environment
from envrl.runtime.process import report_ready
from envrl.serve import protocol as p
from envrl.serve.config import EnvServerConfig
from envrl.serve.dispatch import SWEEP_INTERVAL, WorkerDispatch
from envrl.serve.params import ParamsChecker
from envrl.serve.pool import WorkerPool
from envrl.serve.processes import WorkerProcesses
from envrl.serve.requests import Request, RequestBook
from envrl.serve.sender import ClientSender
from envrl.serve.sockets import ServerSockets
from envrl.serve.zmqio import (
    EVENTS,
    MAX_BATCH,
    NOBLOCK,
    POLLIN,
    RCVMORE,
    SMALL_BATCH,
    StopSignals,
    raw_get,
    raw_recv,
)  # fmt: skip
from envrl.telemetry.log import Throttle

WORKER_STOP_GRACE = 3.0


class EnvServer:
    """Serves one environment on bound `sockets`; `serve()` runs the loop, `close()` releases all."""

    def __init__(self, config: EnvServerConfig, sockets: ServerSockets, env: Environment) -> None:
        self.config = config
        self.sockets = sockets
        self.env = env
        self.num_tasks = {"train": env.num_tasks("train"), "eval": env.num_tasks("eval")}
        self.checker = ParamsChecker(self.num_tasks, config.max_group_size, config.client is not None)
        self.client_info = None if config.client is None else p.ClientInfo.of(config.client)
        self.requests = RequestBook()
        self.pool = WorkerPool(config.pool)
        self.processes = WorkerProcesses(config, sockets.workers_address)
        self.sender = ClientSender(
            sockets.clients, config.client_send_queue, config.client_stall_timeout_s, self._on_client_dropped
        )
        self.dispatch = WorkerDispatch(
            config, sockets.workers, env, self.pool, self.processes, self.requests, self._finish
        )
        self.poller = zmq.Poller()
        self.poller.register(sockets.clients, zmq.POLLIN)
        self.poller.register(sockets.workers, zmq.POLLIN)
        self.draining_until: float | None = None
        self.reported = False
        self.next_scale = 0.0
        self.error_log = Throttle()
        """Bounds the tracebacks a flood of failing requests writes."""

    # -- the loop ---------------------------------------------------------------------------------

    def serve(self) -> int:
        """Serve until SIGTERM/SIGINT and a drain, or until workers cannot start; return the exit code."""
        signals = StopSignals()
        self.poller.register(signals.fd, zmq.POLLIN)
        try:
            while True:
                now = time.monotonic()
                if self._scale_due(now) and not self._scale(now):
                    return 1
                self.dispatch.flush()
                if self._drained(now):
                    return 0
                events = dict(self.poller.poll(self._poll_timeout_ms(now)))
                if signals.fd in events and self._on_signals(signals.received()):
                    return 0
                if self.sockets.workers in events:
                    self.dispatch.read_workers()
                self._reap_exited(events)
                now = time.monotonic()
                self.dispatch.kill_overdue(now)
                if self.sender.waiting:
                    self.sender.retry(now)
                self.dispatch.dispatch_queue()
                if self.sockets.clients in events:
                    self._read_clients()
                self._report_ready_once()
        finally:
            self._shut_down()
            signals.close()

    def _scale_due(self, now: float) -> bool:
        """At once when demand outgrows the live workers, else once a sweep interval (replacing
        the dead, retiring the idle) rather than on every turn of a busy loop."""
        return now >= self.next_scale or len(self.requests) > self.pool.grow_above

    def _scale(self, now: float) -> bool:
        """Start and retire workers as the pool decides; False when workers cannot start at all."""
        self.next_scale = now + SWEEP_INTERVAL
        if self.draining_until is None:
            plan = self.pool.scale(len(self.requests), now)
            for worker in plan.started:
                self.poller.register(self.processes.start(worker.id, worker.identity), zmq.POLLIN)
            for worker in plan.retired:
                self.dispatch.send_op(worker.id, [p.OP_STOP, 0])
        if self.pool.broken:
            logger.error(self.pool.broken_message(self.config.env.id, self.config.log.file))
            return False
        return True

    def _drained(self, now: float) -> bool:
        return self.draining_until is not None and (not self.requests or now >= self.draining_until)

    def _poll_timeout_ms(self, now: float) -> int:
        timeout = SWEEP_INTERVAL  # deadlines, elastic scaling and drain checks need a turn now and then
        if self.draining_until is not None:
            timeout = min(timeout, max(0.0, self.draining_until - now))
        return int(timeout * 1000) + 1

    def _on_signals(self, signals: list[str]) -> bool:
        """Start draining on the first SIGTERM/SIGINT; return True (stop now) on a second one."""
        if not signals:
            return False
        if self.draining_until is not None:
            logger.warning("second stop signal: stopping without waiting for in-flight rollouts")
            return True
        self.draining_until = time.monotonic() + self.config.drain_timeout_s
        logger.info(f"{signals[0]}: draining {len(self.requests)} requests for up to {self.config.drain_timeout_s:g} s")
        return False

    def _reap_exited(self, events: dict[Any, int]) -> None:
        """Handle each worker process whose exit fd fired, and replace it at the next turn."""
        for fd in [fd for fd in events if isinstance(fd, int) and fd in self.processes.by_exit_fd]:
            self.poller.unregister(fd)
            worker_id, child = self.processes.reap(fd)
            self.dispatch.on_worker_exit(
                self.pool.remove(worker_id, child.poll()), child, self.draining_until is not None
            )
            self.next_scale = 0.0

    def _report_ready_once(self) -> None:
        """Tell the parent (the sidecar pipe) our address once `min_workers` are ready."""
        if not self.reported and self.pool.ready_workers >= self.pool.config.min_workers:
            self.reported = True
            workers = self.pool.ready_workers
            client = "no model client: run is refused" if self.client_info is None else f"client {self.client_info}"
            logger.info(f"serving {self.env.env_id!r} on {self.sockets.address} ({workers} workers ready; {client})")
            report_ready(self.sockets.address)

    # -- client side ------------------------------------------------------------------------------

    def _read_clients(self) -> None:
        sock = self.sockets.clients
        for count in range(1, MAX_BATCH + 1):
            try:
                identity = raw_recv(sock, NOBLOCK)
            except zmq.Again:
                return
            frame = raw_recv(sock, NOBLOCK)  # a ROUTER puts the identity before at least one frame
            self.sender.received_from(identity)
            request_id = None
            first_token = self.requests.next_token
            try:
                if raw_get(sock, RCVMORE):
                    extra = 1
                    while raw_get(sock, RCVMORE):
                        raw_recv(sock, NOBLOCK)
                        extra += 1
                    request_id = p.readable_id(frame, self.config.max_frame_bytes)
                    raise p.ProtocolError(p.BAD_REQUEST, f"a message is one frame, got {extra + 1}", request_id)
                message = p.parse_request(frame, self.config.max_frame_bytes)
                request_id = message.id
                self._on_request(identity, message)
            except p.ProtocolError as e:
                self._answer(identity, p.error_response(e.request_id, e.type, e.message))
            except Exception as e:  # a bug must cost one request, never the server
                self._on_internal_error(identity, request_id, first_token, e)
            if count < SMALL_BATCH and not raw_get(sock, EVENTS) & POLLIN:
                return  # cheaper than the zmq.Again that ends a read of an empty socket

    def _on_internal_error(self, identity: bytes, request_id: str | None, first_token: int, error: Exception) -> None:
        """Answer a request whose handling raised unexpectedly `internal_error`, once: if it was
        already accepted (its token is new), finish it (and cancel it in its worker)."""
        more = self.error_log.suffix()
        if more is not None:
            logger.opt(exception=error).error(
                f"req={request_id}: handling it raised {type(error).__name__}: {error}; answered internal_error{more}"
            )
        frame = p.error_response(
            request_id, p.INTERNAL_ERROR, f"the server failed on this request ({type(error).__name__}: {error})"
        )
        request = self.requests.find(identity, request_id) if request_id is not None else None
        if request is None or request.token < first_token:
            self._answer(identity, frame)
            return
        if request.worker is not None:
            self.dispatch.send_op(request.worker, [p.OP_CANCEL, request.token])
        self._finish(request, frame)

    def _on_client_dropped(self, identity: bytes) -> None:
        """Cancel the requests of a client that left or was dropped: nobody waits for their answers."""
        for request in self.requests.of_client(identity):
            self._cancel(identity, request.request_id)

    def _on_request(self, identity: bytes, message: p.RequestMessage) -> None:
        """Answer health, info and cancel here; check a `run` request's params and accept it."""
        request_id, method, params = message.id, message.method, message.params
        if method == "run":
            self._accept(identity, request_id, self.checker.run(params, request_id))
        elif method == "health":
            self._answer(identity, p.ok_response(request_id, self._health()))
        elif method == "info":
            self._answer(identity, p.ok_response(request_id, self._info()))
        else:
            target = self.checker.cancel(params, request_id).request_id
            self._answer(identity, p.ok_response(request_id, p.CancelResult(cancelled=self._cancel(identity, target))))

    def _health(self) -> p.HealthResult:
        workers = self.pool.ready_workers
        status = "draining" if self.draining_until is not None else "ok" if workers else "starting"
        return p.HealthResult(status=status, workers=workers)

    def _info(self) -> p.ServerInfo:
        return p.ServerInfo(
            protocol_version=p.PROTOCOL_VERSION, env_id=self.env.env_id, num_tasks=self.num_tasks["train"],
            num_eval_tasks=self.num_tasks["eval"], group_scoring=self.env.group_scoring,
            workers=self.pool.ready_workers, in_flight=self.pool.in_flight, capacity=self.pool.capacity,
            queued=len(self.requests.queue), max_queued=self.config.max_queued, client=self.client_info,
        )  # fmt: skip

    def _accept(self, identity: bytes, request_id: str, params: p.RunParams) -> None:
        if self.draining_until is not None:
            raise p.ProtocolError(p.SHUTTING_DOWN, "the server is shutting down and takes no new rollouts", request_id)
        if self.requests.find(identity, request_id) is not None:
            message = f"request id {request_id!r} is already in flight on this connection; ids must be unique"
            raise p.ProtocolError(p.BAD_REQUEST, message, request_id)
        queued = len(self.requests.queue)
        worker = None if queued else self.pool.pick()
        if worker is None and queued >= self.config.max_queued:
            message = f"{self.pool.in_flight} rollouts running and {queued} queued (max_queued); back off and retry"
            raise p.ProtocolError(p.AT_CAPACITY, message, request_id)
        work = p.encode_work(request_id, params)
        self._check_budgets(identity, request_id, len(work))
        request = self.requests.add(identity, request_id, work, params)
        if worker is None:
            self.requests.enqueue(request)
        else:
            self.dispatch.assign(request, worker)

    def _check_budgets(self, identity: bytes, request_id: str, size: int) -> None:
        """Raise `at_capacity` when `size` more bytes would put this client's, or all clients',
        unanswered requests over their budget: held work frames are bounded by bytes, not count."""
        held, total = self.requests.bytes_of(identity), self.requests.total_bytes
        if held + size > self.config.max_client_bytes:
            message = (
                f"this connection's unanswered requests hold {held} bytes and this one {size} "
                f"(max_client_bytes = {self.config.max_client_bytes}); wait for answers and retry"
            )
            raise p.ProtocolError(p.AT_CAPACITY, message, request_id)
        if total + size > self.config.max_pending_bytes:
            message = (
                f"unanswered requests hold {total} bytes and this one {size} "
                f"(max_pending_bytes = {self.config.max_pending_bytes}); back off and retry"
            )
            raise p.ProtocolError(p.AT_CAPACITY, message, request_id)

    def _cancel(self, identity: bytes, request_id: str) -> bool:
        request = self.requests.find(identity, request_id)
        if request is None:
            return False
        if request.worker is None:  # still queued: answer now; the queue skips answered tokens
            self._finish(request, p.error_response(request_id, p.CANCELLED, f"request {request_id} was cancelled"))
        elif not request.cancel_requested:
            request.cancel_requested = True
            self.dispatch.send_op(request.worker, [p.OP_CANCEL, request.token])
            request.set_deadline(time.monotonic() + self.config.timeout.kill_grace_s)
        return True

    def _answer(self, identity: bytes, frame: bytes) -> None:
        self.sender.send_reply(identity, frame)

    def _finish(self, request: Request, frame: bytes) -> None:
        """Answer `request` and forget it: it is never answered twice."""
        self.requests.remove(request)
        self.pool.release(request.worker, request.token)
        self._answer(request.identity, frame)

    # -- shutdown ---------------------------------------------------------------------------------

    def _shut_down(self) -> None:
        """Answer what is left, stop the workers (SIGKILL after a grace period) and close sockets."""
        for request in list(self.requests.by_token.values()):
            message = "the server stopped before this request finished"
            self._finish(request, p.error_response(request.request_id, p.SHUTTING_DOWN, message))
        starting = [worker.id for worker in self.pool.workers.values() if not worker.ready]
        for worker in self.pool.workers.values():
            if worker.ready:
                self.dispatch.send_op(worker.id, [p.OP_STOP, 0])
        self.dispatch.flush()
        self.processes.stop_all(WORKER_STOP_GRACE, starting)
        self.close()

    def close(self) -> None:
        """Release the sockets and the ipc directory (idempotent)."""
        self.sockets.close()
