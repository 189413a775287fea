"""An env server's workers stop with it on their own: none is left to wait out the server's grace
period and be SIGKILLed (the "did not stop within 3 s; killing it" that every `rl` shutdown risked)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.support.env_servers import alive, running_env_server, wait_until

ONE_WORKER = ("--pool", '{"min_workers": 1, "max_workers": 1}')


def test_a_worker_still_starting_when_its_server_stops_is_stopped_not_killed(tmp_path: Path) -> None:
    """The server's `stop` op cannot reach a worker that has not connected yet (its ROUTER drops
    it): that worker is stopped with SIGTERM instead of waiting for a `stop` that never comes."""
    hold = tmp_path / "hold"
    with running_env_server(tmp_path, *ONE_WORKER, "--env.args", json.dumps({"hold": str(hold)})) as server:
        (first,) = server.workers()
        hold.touch()  # the replacement's start-up now waits, before it connects
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: len(server.workers()) == 1 and first not in server.workers(), 30, "a replacement starts")
        (replacement,) = server.workers()
        server.child.popen.send_signal(signal.SIGTERM)
        assert server.child.wait(30) == 0
        assert not alive(replacement)
    log = server.log_file.read_text()
    assert "did not stop" not in log and "killing it" not in log, log[-2000:]


def test_an_idle_worker_exits_on_its_servers_stop(tmp_path: Path) -> None:
    with running_env_server(tmp_path, *ONE_WORKER) as server:
        (worker,) = server.workers()
        server.child.popen.send_signal(signal.SIGTERM)
        assert server.child.wait(30) == 0
        assert not alive(worker)
    log = server.log_file.read_text()
    assert "did not stop" not in log and "killing it" not in log, log[-2000:]
