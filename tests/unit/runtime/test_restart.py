"""`Restart`: the one restart loop policy of the supervisor (`rl`'s, and the sidecars' of the orchestrator and `rl eval`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envrl.runtime.process import ChildFailed, spawn
from envrl.runtime.restarts import Restart, RestartBudget, RestartPolicy


def test_a_failed_start_uses_a_restart_and_the_spent_budget_names_the_last_failure(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    dead = spawn(
        [sys.executable, "-c", "print('bound the port'); raise SystemExit(3)"], name="env server", log_file=log
    )
    dead.wait()
    restart = Restart(dead, RestartBudget(RestartPolicy(max_restarts=2, backoff_s=0.5)))
    assert restart.next_delay() == 0.5
    restart.failed(ChildFailed("env server (pid 7) exited with code 1 before reporting ready; last lines of ...\nboom"))
    assert restart.next_delay() == 1.0  # doubled: the failed start counted
    with pytest.raises(ChildFailed) as raised:
        restart.next_delay()
    message = str(raised.value)
    assert "failed to start again (env server (pid 7) exited with code 1 before reporting ready" in message
    assert "restarts.max_restarts = 2" in message and "bound the port" in message
