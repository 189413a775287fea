"""A server another local user started on the inference port is never taken for the run's own.

The threat (docs/running.md, "Threat model"): every other user reaches every loopback port. A
`nobody` process that listens on the port while vLLM starts answers `/health` with 200; taken for
the run's server, it would get the run's API key and reload token and answer the rollouts.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from envrl.inference.launch import wait_until_serving
from envrl.launcher.recovery import ReplicaBack
from envrl.runtime.listeners import listeners
from envrl.runtime.process import ChildFailed, spawn
from tests.support.other_user import needs_root
from tests.support.ports import free_port
from tests.support.tiny_chat import TINY_CHAT_DIR as TINY_MODEL

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
HEALTHY = """
import http.server, sys
class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Healthy).serve_forever()
"""

TAKE_PORT = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening")
"""


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def nobody_answers_health(port: int) -> Iterator[None]:
    """A `/health` that answers 200 on 127.0.0.1:`port`, served by uid `nobody`."""
    server = subprocess.Popen([*AS_NOBODY, sys.executable, "-c", HEALTHY, str(port)])
    try:
        deadline = time.monotonic() + 20
        while not listening(port):
            assert server.poll() is None and time.monotonic() < deadline, "nobody's server did not start"
            time.sleep(0.05)
        yield
    finally:
        server.kill()
        server.wait()


def test_a_health_answer_from_another_users_server_is_not_our_server_serving(tmp_path: Path) -> None:
    needs_root()
    port = free_port()
    # the run's server, still loading (vLLM imports and starts its engine for up to minutes)
    starting = spawn([sys.executable, "-c", "import time; time.sleep(60)"], name="inference", log_file=tmp_path / "log")
    try:
        with nobody_answers_health(port), pytest.raises(ChildFailed, match="uid 65534") as failed:
            wait_until_serving(starting, f"http://127.0.0.1:{port}", timeout=15)
    finally:
        starting.stop(grace=1)
    assert f"127.0.0.1:{port}" in str(failed.value) and "not this run's" in str(failed.value)


def our_listener(port: int) -> bool:
    return any(uid == os.getuid() for _, uid in listeners(port))


def test_no_other_user_can_take_the_port_while_the_server_starts(tmp_path: Path) -> None:
    """Before: vLLM bound its port without listening until its engine served (a minute on CPU), and
    SO_REUSEADDR let any user bind and listen on that port meanwhile, so its own listen failed and the
    other user's server answered the run."""
    needs_root()
    port = free_port()
    argv = [sys.executable, "-m", "envrl.inference.main", "--port", str(port), "--output-dir", str(tmp_path)]
    server = spawn([*argv, "--model.name", str(TINY_MODEL)], name="inference", log_file=tmp_path / "inference.log")
    try:
        deadline = time.monotonic() + 60
        while not our_listener(port):
            assert server.poll() is None, server.log_tail()
            assert time.monotonic() < deadline, "the server did not listen within 60 s of its start"
            time.sleep(0.05)
        with pytest.raises(httpx.HTTPError):  # still starting: the connection waits in the backlog
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
        took = subprocess.run(
            [*AS_NOBODY, sys.executable, "-c", TAKE_PORT, str(port)], capture_output=True, text=True, timeout=30
        )
    finally:
        server.stop(grace=5)
    assert took.returncode != 0 and "Address already in use" in took.stderr, took.stdout + took.stderr


def test_a_restarted_replica_found_on_another_users_server_ends_the_run_before_the_token_goes_there(
    tmp_path: Path,
) -> None:
    """While a replica was dead its port was free: a `nobody` server there answers `/health`, and
    the launcher's recovery, taking it for the replica, would post `/update_weights` with the
    run's reload token to it."""
    needs_root()
    port = free_port()
    (tmp_path / "weights" / "step_0").mkdir(parents=True)  # a policy the recovery would load
    back = ReplicaBack(f"http://127.0.0.1:{port}", "m", tmp_path, token="the-run-s-reload-token")
    with nobody_answers_health(port), pytest.raises(ChildFailed, match=r"uid 65534\) listens at"):
        back()
