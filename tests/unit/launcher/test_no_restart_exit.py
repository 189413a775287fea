"""A child that exits with NO_RESTART_EXIT (the orchestrator stopped by a strict check, issue 39)
ends the run instead of being restarted within its budget."""

from __future__ import annotations

import sys

import pytest

from envrl.runtime.process import Child, ChildFailed, spawn
from envrl.runtime.restarts import NO_RESTART_EXIT, RestartPolicy
from envrl.runtime.supervisor import Respawn, Supervisor


def test_a_child_that_asks_not_to_be_restarted_ends_the_run() -> None:
    stops = [sys.executable, "-c", f"raise SystemExit({NO_RESTART_EXIT})"]
    started: list[Child] = []

    def start() -> Child:
        started.append(spawn(stops, name="orchestrator"))
        return started[-1]

    supervisor = Supervisor(grace=1.0)
    supervisor.add(start(), Respawn(start, RestartPolicy(backoff_s=0.0)))
    try:
        with pytest.raises(ChildFailed, match=f"exited with code {NO_RESTART_EXIT}"):
            supervisor.watch(until={"orchestrator"})
    finally:
        supervisor.stop_all()
    assert len(started) == 1, "never restarted"
