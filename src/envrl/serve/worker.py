"""One env worker: every run op is answered exactly once with a finished frame (error Traces for env failures and
timeouts), it trusts the server's validated requests and its one model client, and it dies with its server."""

from __future__ import annotations

from envrl.runtime.lifeline import die_with_parent

die_with_parent()  # first: a parent that dies while the imports below load leaves no orphan

import asyncio
import gc
import os
import resource
import signal
import sys
from contextvars import ContextVar
from functools import partial
from pathlib import Path
from typing import Any

import zmq
from loguru import logger
from pydantic import TypeAdapter

from envrl.config import BaseConfig
from envrl.data.traces import Error, Task, Trace
from envrl.envs.registry import load_environment
from envrl.model.client import ClientConfig, ModelClient, SamplingArgs, build_client
from envrl.sandbox.bridge import RELAYS_PER_WORKER
from envrl.serve import protocol as p
from envrl.serve.config import EnvSpec, EnvTimeoutConfig
from envrl.serve.zmqio import Frames, SocketPump
from envrl.telemetry.log import LogConfig, LogLevel, setup_logging

SWEEP_INTERVAL = 0.1
"""Seconds between checks for rollouts past `timeout.rollout_s` (one sweep instead of a timer each)."""
UNENCODABLE_ERRORS = (TypeError, ValueError, OverflowError)
"""What msgpack raises for a value it cannot carry: an unsupported type, a non-str key, an int past 64 bits."""
WORKER_IDENTITY_ENV = "ENVRL_WORKER_IDENTITY"
"""The worker's socket identity on its server's pool socket, set by the server; the worker takes
it out of its environment at start, so nothing it runs (envs, forked scoring) inherits it."""
WORKER_CONFIG_ENV = "ENVRL_WORKER_CONFIG"
"""The worker's `WorkerConfig` as JSON, set by the server and taken out the same way: an
environment is readable by this user only, a command line by every local user (the env's args
may hold what others must not read)."""
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The request a rollout task serves: tags every log line the task (or the env in it) writes."""
CLIENT_CONFIG: TypeAdapter[ClientConfig] = TypeAdapter(ClientConfig)
NOFILE_NEEDED = 3 * RELAYS_PER_WORKER + 1024
"""File descriptors a worker may need: every sandbox bridge relay it may hold (3 fds each) and
room for its sandboxes' pipes, model connections and imports."""


class WorkerConfig(BaseConfig):
    """What the server hands a worker it spawns (internal: `python -m envrl.serve.worker`)."""

    worker_id: int
    address: str
    """The server's pool socket (ipc://...)."""
    env: EnvSpec
    timeout: EnvTimeoutConfig
    log_file: Path | None = None
    log_level: LogLevel = "INFO"


class Worker:
    """Runs the requests its server assigns it; construct it inside its event loop."""

    def __init__(self, config: WorkerConfig, env: Any, identity: bytes) -> None:
        self.config = config
        self.env = env
        self.running: dict[int, asyncio.Task[None]] = {}
        self.deadlines: dict[int, float] = {}
        self.timed_out: set[int] = set()
        self.client: ModelClient | None = None
        """The server's model client, once its `client` op arrived; every rollout uses it."""
        self.client_problem = "the server sent no model client"
        """Why `client` is None (a run op then answers with it)."""
        self.done_tokens: list[int] = []
        self.done_frames: list[bytes] = []
        """Answers finished since the last `_flush`, and their tokens."""
        self.loop = asyncio.get_running_loop()
        self.stopped: asyncio.Future[None] = self.loop.create_future()
        """Set by the server's `stop` op."""
        socket = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.IDENTITY, identity)
        socket.connect(config.address)
        self.pump = SocketPump(socket, self._on_messages, on_flush=self._flush)

    async def serve(self) -> None:
        """Tell the server we are ready, run what it sends until it says `stop`, then clean up."""
        self.pump.send_message([p.WORKER_READY])
        logger.info(f"ready: {type(self.env).__name__} from {self.config.env.id!r}")
        sweeper = self.loop.create_task(self._sweep())
        try:
            await self.stopped
        finally:
            sweeper.cancel()
            for task in self.running.values():
                task.cancel()
            await asyncio.gather(*self.running.values(), return_exceptions=True)
            if self.client is not None:
                await self.client.aclose()
            self.pump.close(linger_ms=0)

    def _on_messages(self, batch: list[Frames]) -> None:
        """The server's ops (sent by its `WorkerDispatch.flush`): `run` a request (its work frame follows the
        header), `client` (the model client's config follows), `cancel` a request, `stop`."""
        now = self.loop.time()
        for frames in batch:
            payloads = iter(frames[1:])
            for op, arg in p.decode(frames[0]):
                if op == p.OP_RUN:
                    self._start(arg, next(payloads), now)
                elif op == p.OP_CLIENT:
                    self._build_client(next(payloads))
                elif op == p.OP_CANCEL and arg in self.running:
                    self.running[arg].cancel()
                elif op == p.OP_STOP and not self.stopped.done():
                    self.stopped.set_result(None)

    def _start(self, token: int, frame: bytes, now: float) -> None:
        """Start a task for the rollouts of a request the server accepted; answer at once one whose
        task or model client cannot be had."""
        work = p.decode_work(frame)
        try:
            client = self.client
            if client is None:
                raise RuntimeError(f"the model client could not be built: {self.client_problem}")
            task = self.env.get_task(work.split, work.task_idx)
        except Exception as e:  # a task the env cannot give, a client it could not build
            logger.warning(f"req={work.request_id}: cannot start it: {type(e).__name__}: {e}")
            self._done(token, p.error_response(work.request_id, p.BAD_REQUEST, f"run: {type(e).__name__}: {e}"))
            return
        if self.config.timeout.rollout_s is not None:
            self.deadlines[token] = now + self.config.timeout.rollout_s
        job = self.running[token] = self.loop.create_task(
            self._run(token, work.request_id, task, client, work.sampling, work.n)
        )
        job.add_done_callback(partial(self._on_job_end, token, work.request_id, task, work.n))

    def _build_client(self, frame: bytes) -> None:
        """Build the server's model client (its config was validated there; this only makes the
        typed config back from its dump)."""
        try:
            self.client = build_client(CLIENT_CONFIG.validate_python(p.decode(frame)))
        except Exception as e:  # a tokenizer that will not load: each run is answered with why
            logger.warning(f"cannot build the model client: {type(e).__name__}: {e}")
            self.client_problem = f"{type(e).__name__}: {e}"

    async def _run(
        self, token: int, request_id: str, task: Task, client: ModelClient, sampling: SamplingArgs, n: int
    ) -> None:
        REQUEST_ID.set(request_id)  # this task's context only
        frame = None
        try:
            try:
                traces = await self._rollouts(task, client, sampling, n)
            except asyncio.CancelledError:
                frame = self._stopped_frame(token, request_id, task, n)
                return
            frame = self._result_frame(request_id, task, traces)
        except Exception as e:  # a bug here must still answer the request
            logger.opt(exception=e).error(f"answering failed: {type(e).__name__}: {e}; answered internal_error")
            frame = p.error_response(
                request_id, p.INTERNAL_ERROR, f"the env worker failed on this request ({type(e).__name__}: {e})"
            )
        finally:
            self._forget(token)
            if frame is not None:
                self._done(token, frame)

    def _on_job_end(self, token: int, request_id: str, task: Task, n: int, job: asyncio.Task[None]) -> None:
        """A job cancelled before its body ran never reached `_run`'s answer: answer it here."""
        if token in self.running:
            context = REQUEST_ID.set(request_id)
            try:
                frame = self._stopped_frame(token, request_id, task, n)
            finally:
                REQUEST_ID.reset(context)
            self._forget(token)
            self._done(token, frame)

    def _forget(self, token: int) -> None:
        del self.running[token]
        self.deadlines.pop(token, None)
        self.timed_out.discard(token)

    def _stopped_frame(self, token: int, request_id: str, task: Task, n: int) -> bytes:
        """The answer of a job that was cancelled: `cancelled`, or a timeout error Trace past its deadline."""
        if token not in self.timed_out:
            logger.info("cancelled")
            return p.error_response(request_id, p.CANCELLED, f"request {request_id} was cancelled")
        limit = self.config.timeout.rollout_s
        logger.warning(f"rollout ran past timeout.rollout_s = {limit:g} s; answered with a timeout error Trace")
        error = Error(type=p.TIMEOUT, message=f"the rollout ran past timeout.rollout_s = {limit:g} s")
        return self._result_frame(request_id, task, [Trace.from_error(task, error, is_truncated=True)] * n)

    def _result_frame(self, request_id: str, task: Task, traces: list[Trace]) -> bytes:
        """The response carrying `traces`; a Trace msgpack cannot carry becomes an error Trace."""
        try:
            return p.ok_response(request_id, p.RunResult(traces=traces))
        except UNENCODABLE_ERRORS as e:
            logger.error(f"the environment returned a Trace msgpack cannot carry ({type(e).__name__}: {e})")
        return p.ok_response(request_id, p.RunResult(traces=[_sendable(task, trace) for trace in traces]))

    def _done(self, token: int, frame: bytes) -> None:
        if not self.done_tokens:
            self.pump.wake()
        self.done_tokens.append(token)
        self.done_frames.append(frame)

    def _flush(self) -> None:
        """Send every response finished since the last burst as one message (the pump's on_flush)."""
        if self.done_tokens:
            tokens, frames = self.done_tokens, self.done_frames
            self.done_tokens, self.done_frames = [], []
            self.pump.send_message([p.WORKER_DONE, p.encode(tokens), *frames])  # type: ignore[arg-type]

    async def _sweep(self) -> None:
        """Cancel rollouts past their deadline; `_run` turns those into timeout Traces."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            now = loop.time()
            for token, deadline in list(self.deadlines.items()):
                if deadline <= now and token not in self.timed_out:
                    self.timed_out.add(token)
                    self.running[token].cancel()

    async def _rollouts(self, task: Task, client: ModelClient, sampling: SamplingArgs, n: int) -> list[Trace]:
        try:
            return await self.env.run_group(task, client, sampling, n, scoring_timeout=self.config.timeout.scoring_s)
        except Exception as e:  # the env broke its never-raise contract; still an answer
            logger.error(f"the environment raised {type(e).__name__}: {e} instead of returning an error Trace")
            return [Trace.from_error(task, Error.from_exception(e)) for _ in range(n)]


def _sendable(task: Task, trace: Trace) -> Trace:
    """`trace`, or an `unencodable_trace` error Trace in its place when msgpack cannot carry it."""
    try:
        p.encode(trace.to_wire())
        return trace
    except UNENCODABLE_ERRORS as e:
        message = (
            f"the environment's Trace cannot be sent ({type(e).__name__}: {e}); Trace fields must be msgpack "
            "types: str-keyed maps, lists, str, bytes, int (64-bit), float, bool, None"
        )
        return Trace.from_error(task, Error(type=p.UNENCODABLE, message=message))


async def _serve(config: WorkerConfig, env: Any, identity: bytes) -> None:
    await Worker(config, env, identity).serve()


def _tag_request(record: Any) -> None:
    request_id = REQUEST_ID.get()
    if request_id is not None:
        record["extra"]["process"] = f"{record['extra']['process']} req={request_id}"


def check_nofile(needed: int = NOFILE_NEEDED) -> None:
    """Raise this process's soft RLIMIT_NOFILE to `needed` (capped by the hard limit) if it is
    lower; warn with the numbers when even the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    if soft != resource.RLIM_INFINITY and soft < needed:
        logger.warning(
            f"RLIMIT_NOFILE is {soft} (hard limit {hard}), below the {needed} a worker may need for its sandboxes' "
            f"bridges ({RELAYS_PER_WORKER} relays x 3 fds) and the rest: raise the hard limit (ulimit -Hn, "
            "LimitNOFILE= under systemd) or run fewer rollouts per worker"
        )


def main() -> None:
    identity = os.environ.pop(WORKER_IDENTITY_ENV, "").encode()
    spec = os.environ.pop(WORKER_CONFIG_ENV, "")
    if not identity or not spec:
        sys.exit(
            f"env-worker: {WORKER_IDENTITY_ENV} or {WORKER_CONFIG_ENV} is not set: workers are started by their env server"
        )
    config = WorkerConfig.model_validate_json(spec)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which stops us in order
    setup_logging(LogConfig(level=config.log_level, file=config.log_file), process=f"env-worker[{config.worker_id}]")
    logger.configure(patcher=_tag_request)
    check_nofile()
    try:
        env = load_environment(config.env.id, **config.env.args)
    except Exception as e:
        logger.opt(exception=e).error(f"cannot load environment {config.env.id!r}: {type(e).__name__}: {e}")
        sys.exit(1)
    asyncio.run(_serve(config, env, identity))
    # Everything is closed: exit without the collector's full passes over every object the env and
    # its imports made, which the interpreter's shutdown runs and which were most of a stopped
    # worker's exit time (long enough on a busy machine for the server to SIGKILL it).
    gc.freeze()


if __name__ == "__main__":
    main()
