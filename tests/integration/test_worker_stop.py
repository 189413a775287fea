"""An env server's workers stop with it on their own: none is left to wait out the server's grace
period and be SIGKILLed (the "did not stop within 3 s; killing it" that `rl` shutdowns logged)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.support.env_servers import alive, running_env_server, wait_until


def test_ready_and_still_starting_workers_stop_with_their_server_without_a_kill(tmp_path: Path) -> None:
    """A ready worker exits on the server's `stop` op. That op cannot reach a worker that has not
    connected yet (the server's ROUTER drops it): such a worker is stopped with SIGTERM instead of
    waiting for a `stop` that never comes."""
    hold = tmp_path / "hold"
    pool = '{"min_workers": 2, "max_workers": 2}'
    with running_env_server(tmp_path, "--pool", pool, "--env.args", json.dumps({"hold": str(hold)})) as server:
        wait_until(lambda: "(2 ready)" in server.log_file.read_text(), 30, "both workers ready")
        idle, victim = server.workers()
        hold.touch()  # the replacement's start-up now waits, before it connects
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: victim not in server.workers() and len(server.workers()) == 2, 30, "a replacement starts")
        (starting,) = set(server.workers()) - {idle}
        server.child.popen.send_signal(signal.SIGTERM)
        assert server.child.wait(30) == 0
        assert not alive(idle) and not alive(starting)
    log = server.log_file.read_text()
    assert "did not stop" not in log and "killing it" not in log, log[-2000:]
