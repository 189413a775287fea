"""The worker pool as decisions: never more than `max_workers` live, `min_workers` kept, at most `multiplex`
requests per worker, only idle workers retired; it holds no process or socket, so a test drives every decision."""

from __future__ import annotations

import math
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from envrl.serve.config import PoolConfig

MAX_STARTUP_FAILURES = 3
"""Workers in a row that fail before ready: then the pool gives up (a broken env, not bad luck)."""
OUTSIDE_KILLS = (-signal.SIGKILL, -signal.SIGTERM)
"""Exit codes of a worker stopped from outside (an operator, a chaos test, the OOM killer): they say
nothing about the environment, so they are not start-up failures. Exiting with an error or
crashing (SIGSEGV, SIGABRT) is."""


@dataclass(eq=False)
class WorkerHandle:
    """What the server knows of one worker: its state and the requests it runs (not its process)."""

    id: int
    ready: bool = False
    retiring: bool = False
    kill_reason: str | None = None
    """Why the server killed it, if it did (for the log line about its death)."""
    load: set[int] = field(default_factory=set)
    """Tokens of the requests it is running."""
    idle_since: float = field(default_factory=time.monotonic)
    identity: bytes = field(default_factory=lambda: secrets.token_hex(16).encode())
    """Its socket identity on the pool socket: random, handed only to its process, so no other
    peer on the ipc socket can pose as it (frames from unknown identities are ignored)."""


@dataclass(frozen=True)
class ScalePlan:
    """What one `scale` decided: workers added (the caller starts their processes) and workers
    marked retiring (the caller sends them `stop`)."""

    started: list[WorkerHandle]
    retired: list[WorkerHandle]


class WorkerPool:
    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.workers: dict[int, WorkerHandle] = {}
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

    # -- membership -------------------------------------------------------------------------------

    def add(self) -> WorkerHandle:
        """A new worker, starting (not ready); ids are never reused."""
        worker_id, self._next_id = self._next_id, self._next_id + 1
        worker = self.workers[worker_id] = WorkerHandle(worker_id)
        return worker

    def by_identity(self, identity: bytes) -> WorkerHandle | None:
        """The live worker whose socket identity this is (None: not one of ours)."""
        return next((w for w in self.workers.values() if w.identity == identity), None)

    def mark_ready(self, worker: WorkerHandle) -> None:
        if not worker.ready:
            worker.ready = True
            worker.idle_since = time.monotonic()
            self.startup_failures = 0
            logger.info(f"worker {worker.id} ready ({self.ready_workers} ready)")

    def remove(self, worker_id: int, exit_code: int | None) -> WorkerHandle:
        """Forget a worker whose process exited with `exit_code`; its `load` is the caller's to
        answer. One that dies before ready, on its own, counts as a start-up failure."""
        worker = self.workers.pop(worker_id)
        if not worker.ready and not worker.retiring and exit_code not in OUTSIDE_KILLS:
            self.startup_failures += 1
        return worker

    # -- load -------------------------------------------------------------------------------------

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

    # -- size -------------------------------------------------------------------------------------

    def scale(self, demand: int, now: float) -> ScalePlan:
        """Add workers for `demand` (running + queued requests) and mark idle ones retiring.

        Sets `grow_above`: until demand exceeds it, calling again before idle workers could retire
        changes nothing. A broken pool (start-up failures) decides nothing.
        """
        if self.broken:
            return ScalePlan([], [])
        live = self.live
        wanted = min(self._wanted(demand), self.config.max_workers)
        started = [self.add() for _ in range(wanted - len(live))]
        retired = self._retire_idle(live, wanted, now)
        self._set_grow_above(len(live) + len(started) - len(retired))
        return ScalePlan(started, retired)

    def _wanted(self, demand: int) -> int:
        return max(self.config.min_workers, math.ceil(demand / self._per_worker()))

    def _retire_idle(self, live: list[WorkerHandle], wanted: int, now: float) -> list[WorkerHandle]:
        """Mark retiring the workers above `wanted` that have been idle past `idle_timeout_s`."""
        if len(live) <= wanted:
            return []
        timeout = self.config.idle_timeout_s
        idle = [w for w in live if w.ready and not w.load and now - w.idle_since > timeout]
        retired = idle[: len(live) - wanted]
        for worker in retired:
            worker.retiring = True
            logger.info(f"worker {worker.id} retiring after {now - worker.idle_since:.0f} s idle")
        return retired

    def _set_grow_above(self, live: int) -> None:
        if live < self.config.max_workers:
            self.grow_above = live * self._per_worker()
        else:
            self.grow_above = math.inf

    def _per_worker(self) -> float:
        """Requests per live worker above which the pool grows."""
        return self.config.grow_at * self.config.multiplex
