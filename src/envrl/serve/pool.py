"""The env server's worker processes: which exist, which are ready, how loaded, when to grow or shrink.

Guarantee: the pool never has more than `max_workers` processes, keeps `min_workers` alive
(replacing the dead), never gives a worker more than `multiplex` requests, and retires only idle
workers. It holds no sockets: the server sends the ops the pool decides on.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from envrl.process import Child
from envrl.serve.config import ElasticPoolConfig, StaticPoolConfig

MAX_STARTUP_FAILURES = 3
"""Workers in a row that fail before ready: then the pool gives up (a broken env, not bad luck)."""
OUTSIDE_KILLS = (-signal.SIGKILL, -signal.SIGTERM)
"""Exit codes of a worker stopped from outside (an operator, a chaos test, the OOM killer): they say
nothing about the environment, so they are not start-up failures. Exiting with an error or
crashing (SIGSEGV, SIGABRT) is."""


@dataclass(eq=False)
class WorkerHandle:
    id: int
    child: Child
    ready: bool = False
    retiring: bool = False
    kill_reason: str | None = None
    """Why the server killed it, if it did (for the log line about its death)."""
    load: set[int] = field(default_factory=set)
    """Tokens of the requests it is running."""
    idle_since: float = field(default_factory=time.monotonic)
    identity: bytes = b""
    """Its socket identity on the pool socket (its id as text)."""

    def __post_init__(self) -> None:
        self.identity = str(self.id).encode()


class WorkerPool:
    def __init__(self, config: StaticPoolConfig | ElasticPoolConfig, spawn: Callable[[int], Child]) -> None:
        self.config = config
        self.spawn = spawn
        self.workers: dict[int, WorkerHandle] = {}
        self.by_exit_fd: dict[int, WorkerHandle] = {}
        self.startup_failures = 0
        self._next_id = 0
        self.grow_above: float = 0.0
        """Demand above which `scale` would start another worker (infinite when it cannot grow)."""

    @property
    def capacity(self) -> int:
        return self.config.max_workers * self.config.multiplex

    @property
    def ready_workers(self) -> int:
        return sum(1 for w in self.workers.values() if w.ready)

    @property
    def in_flight(self) -> int:
        return sum(len(w.load) for w in self.workers.values())

    @property
    def live(self) -> list[WorkerHandle]:
        """Workers that are or will be taking requests (starting or ready, not retiring)."""
        return [w for w in self.workers.values() if not w.retiring]

    @property
    def broken(self) -> bool:
        return self.startup_failures >= MAX_STARTUP_FAILURES

    def broken_message(self, env_id: str, log_file: Path | None) -> str:
        return (
            f"{self.startup_failures} env workers in a row failed before they were ready; environment "
            f"{env_id!r} cannot start in a worker (see {log_file or 'the server stderr'} for their errors)"
        )

    def add_worker(self) -> WorkerHandle:
        worker_id, self._next_id = self._next_id, self._next_id + 1
        worker = WorkerHandle(worker_id, self.spawn(worker_id))
        self.workers[worker_id] = worker
        self.by_exit_fd[worker.child.exit_fd] = worker
        logger.info(f"worker {worker_id} starting (pid {worker.child.pid})")
        return worker

    def mark_ready(self, identity: bytes) -> None:
        worker = self.workers.get(int(identity))
        if worker is not None and not worker.ready:
            worker.ready = True
            worker.idle_since = time.monotonic()
            self.startup_failures = 0
            logger.info(f"worker {worker.id} ready ({self.ready_workers} ready)")

    def remove_exited(self, exit_fd: int) -> WorkerHandle:
        """Forget the worker whose exit fd fired; its `load` is the caller's to answer."""
        worker = self.by_exit_fd.pop(exit_fd)
        del self.workers[worker.id]
        code = worker.child.wait()
        if not worker.ready and not worker.retiring and code not in OUTSIDE_KILLS:
            self.startup_failures += 1
        worker.child.close()
        return worker

    def pick(self) -> WorkerHandle | None:
        """The least-loaded ready worker with a free slot, if any."""
        best: WorkerHandle | None = None
        for worker in self.workers.values():
            free = worker.ready and not worker.retiring and len(worker.load) < self.config.multiplex
            if free and (best is None or len(worker.load) < len(best.load)):
                best = worker
        return best

    def assign(self, worker: WorkerHandle, token: int) -> None:
        worker.load.add(token)

    def release(self, worker_id: int | None, token: int) -> None:
        worker = self.workers.get(worker_id) if worker_id is not None else None
        if worker is not None:
            worker.load.discard(token)
            if not worker.load:
                worker.idle_since = time.monotonic()

    def scale(self, demand: int, now: float) -> list[WorkerHandle]:
        """Start workers for `demand` (running + queued requests); return idle workers to retire.

        Sets `grow_above`: until demand exceeds it, calling again before idle workers could retire
        changes nothing.
        """
        if self.broken:
            return []
        live = self.live
        wanted = self.config.min_workers
        if isinstance(self.config, ElasticPoolConfig):
            per_worker = self.config.grow_at * self.config.multiplex
            wanted = max(wanted, math.ceil(demand / per_worker) if demand else 0)
        wanted = min(wanted, self.config.max_workers)
        for _ in range(wanted - len(live)):
            self.add_worker()
        retire: list[WorkerHandle] = []
        if isinstance(self.config, ElasticPoolConfig) and len(live) > wanted:
            idle = [w for w in live if w.ready and not w.load and now - w.idle_since > self.config.idle_timeout]
            retire = idle[: len(live) - max(wanted, self.config.min_workers)]
            for worker in retire:
                worker.retiring = True
                logger.info(f"worker {worker.id} retiring after {now - worker.idle_since:.0f} s idle")
        live_now = len(live) - len(retire) + max(0, wanted - len(live))
        if isinstance(self.config, ElasticPoolConfig) and live_now < self.config.max_workers:
            self.grow_above = live_now * per_worker
        else:
            self.grow_above = math.inf
        return retire
