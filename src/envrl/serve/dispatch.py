"""The env server's worker side: a worker gets the model client before its first run; an answer is passed on only
for a request that worker holds unanswered; a dead worker's requests are re-run or answered; an overdue worker is
killed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq
from loguru import logger

from envrl.data.traces import Error
from envrl.envs.environment import Environment
from envrl.runtime.process import Child
from envrl.serve import protocol as p
from envrl.serve.config import EnvServerConfig
from envrl.serve.pool import MAX_STARTUP_FAILURES, OUTSIDE_KILLS, WorkerHandle, WorkerPool
from envrl.serve.processes import WorkerProcesses
from envrl.serve.requests import Request, RequestBook
from envrl.serve.zmqio import MAX_BATCH, recv_batch, send_frames
from envrl.telemetry.log import Throttle

SWEEP_INTERVAL = 0.1
"""Seconds between scans for overdue rollouts (one scan instead of a timer per request)."""


class WorkerDispatch:
    """Sends work to the pool's workers over `sock` (the server's worker ROUTER) and reads their
    answers; `finish(request, frame)` answers a request and removes it from the book."""

    def __init__(
        self,
        config: EnvServerConfig,
        sock: zmq.Socket[bytes],
        env: Environment,
        pool: WorkerPool,
        processes: WorkerProcesses,
        requests: RequestBook,
        finish: Callable[[Request, bytes], None],
    ) -> None:
        self.config = config
        self.sock = sock
        self.env = env
        self.pool = pool
        self.processes = processes
        self.requests = requests
        self.finish = finish
        self.outbox: dict[int, tuple[list[list[Any]], list[bytes]]] = {}
        """Per worker id, the ops and their frames (the client config, work) to send it at the next `flush`."""
        self.client_frame = None if config.client is None else p.encode(config.client.model_dump(mode="json"))
        """The model client config every worker builds its client from (sent once, at its `ready`)."""
        self.next_sweep = 0.0
        self.stranger_log = Throttle()

    def assign(self, request: Request, worker: WorkerHandle) -> None:
        """Give `request` to `worker`: a `run` op and the request's work frame, sent at the next `flush`."""
        request.worker = worker.id
        self.pool.assign(worker, request.token)
        if self.config.timeout.rollout_s is not None:
            limit = self.config.timeout.rollout_s + self.config.timeout.kill_grace_s
            request.set_deadline(time.monotonic() + limit)
        self._send_with_frame(worker.id, [p.OP_RUN, request.token], request.work)

    def _send_with_frame(self, worker_id: int, op: list[Any], frame: bytes) -> None:
        ops, frames = self.outbox.setdefault(worker_id, ([], []))
        ops.append(op)
        frames.append(frame)

    def send_op(self, worker_id: int, op: list[Any]) -> None:
        self.outbox.setdefault(worker_id, ([], []))[0].append(op)

    def flush(self) -> None:
        """Send each worker its ops of this loop turn as one message: [identity, ops, frame, ...]
        (serve/worker.py `_on_messages` reads it)."""
        for worker_id, (ops, frames) in self.outbox.items():
            worker = self.pool.workers.get(worker_id)
            if worker is not None:
                send_frames(self.sock, [worker.identity, p.encode(ops), *frames])
        self.outbox.clear()

    def dispatch_queue(self) -> None:
        """Assign queued requests, oldest first (re-runs first), while a worker has a free slot."""
        while (request := self.requests.peek_queued()) is not None:
            worker = self.pool.pick()
            if worker is None:
                return
            self.requests.pop_queued()
            self.assign(request, worker)

    def read_workers(self) -> None:
        """A worker's `ready` (it is then sent the model client), or its finished answers ([done,
        tokens, frame, ...]): pass each on (`finish`); answers to requests already answered are dropped."""
        for frames in recv_batch(self.sock, MAX_BATCH):
            worker = self.pool.by_identity(frames[0])
            if worker is None:
                self._on_stranger(frames)
                continue
            if frames[1:2] == [p.WORKER_READY]:
                if not worker.ready and self.client_frame is not None:
                    self._send_with_frame(worker.id, [p.OP_CLIENT, 0], self.client_frame)
                self.pool.mark_ready(worker)
                continue
            for token, frame in zip(p.decode(frames[2]), frames[3:], strict=False):
                request = self.requests.by_token.get(token)
                if request is not None and request.worker == worker.id:  # only what it was given
                    self.finish(request, frame)

    def _on_stranger(self, frames: list[bytes]) -> None:
        """A frame on the worker socket from a peer that is none of our workers: ignored, and logged
        at most a burst a minute (a process on the node is probing the socket)."""
        more = self.stranger_log.suffix()
        if more is not None:
            logger.warning(f"ignored a {len(frames)}-frame message on the worker socket from an unknown peer{more}")

    def on_worker_exit(self, worker: WorkerHandle, child: Child, draining: bool) -> None:
        """Log a worker's death; re-run or answer `worker_died` the requests it was running
        (answer them all when `draining`)."""
        how = worker.kill_reason or child.describe_exit()
        if worker.retiring and not worker.load:
            logger.info(f"worker {worker.id} retired ({how})")
            return
        if not worker.ready:
            if child.poll() in OUTSIDE_KILLS:
                note = "; a kill from outside, not counted as a start-up failure"
            else:
                note = f" ({self.pool.startup_failures} in a row of {MAX_STARTUP_FAILURES} allowed)"
            logger.error(f"worker {worker.id} (pid {child.pid}) {how} before it was ready{note}")
            return
        rerun, failed = self.requests.after_worker_death(worker.load, self.config.max_reruns, draining)
        logger.warning(
            f"worker {worker.id} (pid {child.pid}) {how} with {len(worker.load)} requests in flight: "
            f"re-running {len(rerun)}, answering {len(failed)} worker_died"
        )
        for request, why in failed:
            logger.warning(f"req={request.request_id}: answered worker_died")
            message = f"env worker {worker.id} {how} while running this request ({why})"
            self.finish(request, request.error_answer(self.env, Error(type=p.WORKER_DIED, message=message)))

    def kill_overdue(self, now: float) -> None:
        """A worker that let a rollout pass its deadline by kill_grace_s is stuck: kill and replace it."""
        if now < self.next_sweep:
            return
        self.next_sweep = now + SWEEP_INTERVAL
        for request in self.requests.overdue(now):
            if request.token not in self.requests.by_token or request.worker is None:
                continue  # answered when an earlier overdue request's worker was killed
            worker = self.pool.workers[request.worker]
            grace = self.config.timeout.kill_grace_s
            if request.cancel_requested:
                what = f"did not stop request {request.request_id} within {grace:g} s of its cancel"
                frame = p.error_response(request.request_id, p.CANCELLED, f"request {request.request_id} was cancelled")
            else:
                what = f"did not finish request {request.request_id} within timeout.rollout_s + {grace:g} s"
                message = f"the rollout ran past timeout.rollout_s = {self.config.timeout.rollout_s:g} s and its worker was stuck"
                frame = request.error_answer(self.env, Error(type=p.TIMEOUT, message=message), is_truncated=True)
            logger.warning(f"req={request.request_id}: worker {worker.id} {what} (blocking code?); killing it")
            self.finish(request, frame)
            worker.kill_reason = f"was killed by the server (it {what})"
            self.processes.kill(worker.id)
