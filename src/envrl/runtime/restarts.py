"""Restarting a dead child: a `RestartBudget` allows at most `max_restarts` restarts within any `window_s` seconds,
each after a doubling backoff; a child that exits `NO_RESTART_EXIT` is not restarted."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from loguru import logger
from pydantic import Field

from envrl.config import BaseConfig

if TYPE_CHECKING:
    from envrl.runtime.process import Child, ChildFailed

NO_RESTART_EXIT = 3
"""A child's exit status for "stopped on purpose, do not restart me" (the orchestrator after a
strict check failed): a supervisor ends the run with it instead of restarting the child."""


class RestartPolicy(BaseConfig):
    """How a server that dies is restarted (on its address) before the run gives up on it."""

    max_restarts: int = Field(3, ge=0)
    """Restarts allowed within any `window_s` seconds; one more death fails the run (0: never restart)."""
    window_s: float = Field(600.0, gt=0)
    """The sliding window `max_restarts` counts over."""
    backoff_s: float = Field(1.0, ge=0)
    """Wait before the first restart in a window; doubled for each further one."""
    max_backoff_s: float = Field(30.0, ge=0)
    """Longest wait before a restart."""


class RestartBudget:
    """The restarts left to one server under a `RestartPolicy`."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._times: list[float] = []
        self.total = 0
        """Restarts granted so far, over the whole run."""

    def next_delay(self) -> float | None:
        """Seconds to wait before the next restart, or None when the window's budget is spent."""
        now = time.monotonic()
        self._times = [t for t in self._times if now - t < self.policy.window_s]
        if len(self._times) >= self.policy.max_restarts:
            return None
        delay = min(self.policy.backoff_s * 2 ** len(self._times), self.policy.max_backoff_s)
        self._times.append(now)
        self.total += 1
        return delay

    def exhausted(self) -> str:
        """Why no restart is left, for the error that ends the run."""
        return (
            f"it was already restarted {self.policy.max_restarts} time(s) within {self.policy.window_s:g} s "
            f"(restarts.max_restarts = {self.policy.max_restarts}, restarts.window_s = {self.policy.window_s:g}): giving up"
        )


class Restart:
    """One dead child's way back under its `RestartBudget`, for the one `Supervisor`
    (`runtime/supervisor.py`) that `rl`, a standalone orchestrator and `rl eval` use.

    Each try: `next_delay()` (log why, then wait that long), start the child, on `ChildFailed` call
    `failed` (a failed start uses up a restart too) and try again.
    """

    def __init__(self, dead: Child, budget: RestartBudget) -> None:
        self.dead = dead
        self.budget = budget
        self.what = dead.describe_exit()
        self._tail = dead.log_tail(10)

    def next_delay(self) -> float:
        """Seconds to wait before the next start; ChildFailed naming the child once the budget is spent."""
        delay = self.budget.next_delay()
        if delay is None:  # named with the tail of its log, which every start appends to
            raise self.dead.failure(f"{self.what}, and {self.budget.exhausted()}")
        tail = f"; last lines of {self.dead.log_file}:\n{self._tail}" if self._tail else ""
        logger.warning(
            f"{self.dead.name} (pid {self.dead.pid}) {self.what}; restarting it in {delay:g} s "
            f"(restart {self.budget.total}){tail}"
        )
        return delay

    def failed(self, error: ChildFailed) -> None:
        """The last start failed (its message carries its own log tail)."""
        self.what, self._tail = f"failed to start again ({str(error).splitlines()[0]})", ""
