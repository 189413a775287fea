"""Watching a run's processes and taking them all down together.

Guarantee: `watch` returns only when every process in `until` has exited 0. A process added with
a `respawn` (the env servers) that exits is started again, on the same address, while its
`RestartPolicy` allows; otherwise `watch` raises `ChildFailed` naming the first process that
exited (any exit of a process not in `until` counts, since servers must not stop on their own)
with the tail of its log.
`stop_all` leaves nothing running: each process and its process group get SIGTERM, then SIGKILL
after the grace period.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from loguru import logger

from envrl.process import Child, ChildFailed, Restart, RestartBudget, RestartPolicy


@dataclass
class _Respawn:
    start: Callable[[], Child]
    """Starts the process again (blocks until it is ready)."""
    budget: RestartBudget


class Supervisor:
    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.children: list[Child] = []
        self._respawn: dict[str, _Respawn] = {}

    def add(
        self, child: Child, respawn: Callable[[], Child] | None = None, restarts: RestartPolicy | None = None
    ) -> Child:
        """Watch `child`; with `respawn` and `restarts`, restart it when it dies (see `watch`)."""
        self.children.append(child)
        if respawn is not None and restarts is not None:
            self._respawn[child.name] = _Respawn(respawn, RestartBudget(restarts))
        return child

    def restarts(self) -> dict[str, int]:
        """Restarts so far, by process name (those that were restarted at least once)."""
        return {name: r.budget.total for name, r in self._respawn.items() if r.budget.total}

    def check(self) -> None:
        """Raise ChildFailed if any child has exited (during start-up none may)."""
        for child in self.children:
            if child.poll() is not None:
                raise child.failure(child.describe_exit())

    def watch(self, until: set[str], progress_every: float = 60.0) -> None:
        finished: set[str] = set()
        started = time.monotonic()
        next_report = started + progress_every
        while not until <= finished:
            live = [c for c in self.children if c.poll() is None]
            select.select([c.exit_fd for c in live], [], [], 1.0)
            for child in list(self.children):
                code = child.poll()
                if code is None or child.name in finished:
                    continue
                if code == 0 and child.name in until:
                    logger.info(f"{child.name} finished")
                    finished.add(child.name)
                elif child.name in self._respawn:
                    self._restart(child)
                else:
                    raise child.failure(child.describe_exit())
            if time.monotonic() >= next_report:
                waiting = ", ".join(sorted(until - finished))
                logger.info(f"running for {time.monotonic() - started:.0f} s; waiting for {waiting}")
                next_report += progress_every

    def _restart(self, child: Child) -> None:
        """Start a dead child again after its backoff; ChildFailed once its budget is spent."""
        respawn = self._respawn[child.name]
        restart = Restart(child, respawn.budget)
        while True:
            time.sleep(restart.next_delay())
            try:
                new = respawn.start()
            except ChildFailed as e:
                restart.failed(e)
                continue
            self.children[self.children.index(child)] = new
            child.close()
            logger.info(f"{child.name} restarted (pid {new.pid})")
            return

    def stop_all(self) -> None:
        """SIGTERM everything at once, SIGKILL what is left after the grace period, groups included."""
        running = [c for c in self.children if c.poll() is None]
        if running:
            logger.info(f"stopping {', '.join(c.name for c in running)}")
        threads = [threading.Thread(target=child.stop, args=(self.grace,)) for child in running]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for child in self.children:
            _kill_group(child.pid)
        self.children.clear()


def _kill_group(pgid: int) -> None:
    """SIGKILL whatever is left of a child's process group (grandchildren it failed to stop)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
