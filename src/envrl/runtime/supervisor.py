"""`watch` returns only when every process in `until` exited 0; a dead process with a `Respawn` is restarted within
its `RestartPolicy` (group killed first), else `ChildFailed`; `stop_all` leaves nothing running."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from envrl.runtime.cli import CONFIG_ERROR_EXIT
from envrl.runtime.process import Child, ChildFailed
from envrl.runtime.restarts import NO_RESTART_EXIT, Restart, RestartBudget, RestartPolicy

Check = Callable[[], bool]
"""True once a restarted process does its work again (polled about once a second)."""


def at_once() -> Check:
    """The `back` of a process whose `start` returns only when it is ready (a sidecar)."""
    return lambda: True


@dataclass
class Respawn:
    """How one process comes back after it died."""

    start: Callable[[], Child]
    """Starts it again (may block until it is ready)."""
    policy: RestartPolicy
    back: Callable[[], Check] = at_once
    """Called at the death, before the restart: a check that passes once the restarted process has
    made up for the death (what counts is decided then, e.g. "published past what was there")."""


@dataclass
class Fault:
    """One death of a restarted process and what it cost."""

    process: str
    exit: str
    """How it died (`describe_exit`)."""
    died_at: float
    """`time.monotonic()` when the supervisor saw it dead."""
    seconds_lost: float | None = None
    """Death to back again (or to its next death); None while it is open."""
    back: bool = False
    """It came back (not: it died again first, or the run ended first)."""


@dataclass
class _Restartable:
    respawn: Respawn
    budget: RestartBudget
    fault: Fault | None = None
    """The open fault: dead or restarted but not back yet."""
    check: Check = field(default_factory=at_once)
    pending: Restart | None = None
    """Its way back while it is dead and not started again."""
    due: float = 0.0
    """`time.monotonic()` at which `pending` starts it again."""


class Supervisor:
    def __init__(self, grace: float, on_recovery: Callable[[dict[str, dict[str, Any]]], None] | None = None) -> None:
        """`on_recovery`: called with `recoveries()` on the watching thread each time a fault opens
        or closes, so that they can be published as they happen."""
        self.grace = grace
        self.on_recovery = on_recovery
        self.children: list[Child] = []
        self.faults: list[Fault] = []
        """Every death of a process that was restarted, in order."""
        self._restartable: dict[str, _Restartable] = {}

    def add(self, child: Child, respawn: Respawn | None = None) -> Child:
        """Watch `child`; with a `respawn`, restart it when it dies (see `watch`)."""
        self.children.append(child)
        if respawn is not None:
            self._restartable[child.name] = _Restartable(respawn, RestartBudget(respawn.policy))
        return child

    def restarts(self) -> dict[str, int]:
        """Restarts so far, by process name (those that were restarted at least once)."""
        return {name: r.budget.total for name, r in self._restartable.items() if r.budget.total}

    def recoveries(self) -> dict[str, dict[str, Any]]:
        """Per restarted process: restarts, seconds lost in all (death to back again, open faults
        counted to now) and each fault, for `summary.json`."""
        now = time.monotonic()
        out: dict[str, dict[str, Any]] = {}
        for fault in self.faults:
            entry = out.setdefault(fault.process, {"restarts": 0, "seconds_lost": 0.0, "faults": []})
            lost = fault.seconds_lost if fault.seconds_lost is not None else now - fault.died_at
            entry["restarts"] = self._restartable[fault.process].budget.total
            entry["seconds_lost"] += lost
            entry["faults"].append({"exit": fault.exit, "seconds_lost": lost, "back": fault.back})
        return out

    def check(self) -> None:
        """Raise ChildFailed if any child has exited (during start-up none may)."""
        for child in self.children:
            if child.poll() is not None:
                raise child.failure(child.describe_exit())

    def watch(self, until: set[str], progress_every: float = 60.0, stop: threading.Event | None = None) -> None:
        """Watch until every process of `until` finished, or (given `stop`) until `stop` is set;
        `add` may be called meanwhile from another thread."""
        finished: set[str] = set()
        started = time.monotonic()
        next_report = started + progress_every
        while not (stop.is_set() if stop is not None else until <= finished):
            live = [c for c in self.children if c.poll() is None]
            select.select([c.exit_fd for c in live], [], [], self._wait())
            for child in list(self.children):
                code = child.poll()
                if code is None or child.name in finished:
                    continue
                if code == 0 and child.name in until:
                    logger.info(f"{child.name} finished")
                    finished.add(child.name)
                    self._close_fault(child.name)
                elif child.name in self._restartable and code not in (NO_RESTART_EXIT, CONFIG_ERROR_EXIT):
                    self._restart(child)
                else:
                    raise child.failure(child.describe_exit())
            self._check_back()
            if time.monotonic() >= next_report:
                waiting = ", ".join(sorted(until - finished))
                logger.info(f"running for {time.monotonic() - started:.0f} s; waiting for {waiting}")
                next_report += progress_every

    def _wait(self) -> float:
        """Seconds to wait for an exit: at most 1 (the `back` checks), less when a restart is due sooner."""
        dues = [entry.due for entry in list(self._restartable.values()) if entry.pending is not None]
        return max(0.0, min([1.0, *(due - time.monotonic() for due in dues)]))

    def _restart(self, child: Child) -> None:
        """A dead child: at its death, open its fault and plan its restart after the backoff
        (ChildFailed once its budget is spent); once due, start it again (a failed start plans
        the next try, since it uses up a restart too)."""
        entry = self._restartable[child.name]
        if entry.pending is None:
            _kill_group(child.pid)  # what it started (vLLM's engine core) must not outlive it, nor hold its port
            self._close_fault(child.name, again=True)
            entry.pending = Restart(child, entry.budget)
            fault = Fault(child.name, entry.pending.what, time.monotonic())
            self.faults.append(fault)
            entry.fault, entry.check = fault, entry.respawn.back()
            self._plan_next(entry, entry.pending)
        if time.monotonic() < entry.due:
            return
        try:
            new = entry.respawn.start()
        except ChildFailed as e:
            entry.pending.failed(e)
            self._plan_next(entry, entry.pending)
            return
        entry.pending = None
        self.children[self.children.index(child)] = new
        child.close()
        logger.info(f"{child.name} restarted (pid {new.pid})")

    def _plan_next(self, entry: _Restartable, restart: Restart) -> None:
        """When `entry` starts again (ChildFailed once its budget is spent); told to `on_recovery` either way."""
        try:
            entry.due = time.monotonic() + restart.next_delay()
        finally:
            self._recovered()

    def _recovered(self) -> None:
        if self.on_recovery is not None:
            self.on_recovery(self.recoveries())

    def _check_back(self) -> None:
        for name, entry in list(self._restartable.items()):
            if entry.fault is not None and entry.pending is None and entry.check():
                self._close_fault(name)

    def _close_fault(self, name: str, again: bool = False) -> None:
        """Close `name`'s open fault: it is back (or, `again`, died again before it was)."""
        entry = self._restartable.get(name)
        if entry is None or entry.fault is None:
            return
        fault, entry.fault = entry.fault, None
        fault.seconds_lost, fault.back = time.monotonic() - fault.died_at, not again
        policy = entry.respawn.policy
        how = "died again before it was back" if again else "back"
        logger.info(
            f"recovery: {name} {fault.exit}; {how} after {fault.seconds_lost:.1f} s lost "
            f"(restart {entry.budget.total}, at most {policy.max_restarts} in {policy.window_s:g} s)"
        )
        if not again:  # else the fault it opens next tells
            self._recovered()

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
