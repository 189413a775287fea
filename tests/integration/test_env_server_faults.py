"""The env server against faults from outside: early cancels, killed workers, clients that stop
reading, Traces msgpack cannot carry, requests that try to pick a model client.

One server (1 static worker x 64, kill_grace_s 30, the smallest client send queue (4096), 1 s stall timeout,
on an ipc:// socket so that a client that stops reading fills its buffers fast) is shared by the
module; the test that kills workers starts its own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from tests.support.bad_envs import HANG, OK, SLEEP, UNENCODABLE
from tests.support.env_servers import (
    SAMPLING,
    RunningServer,
    raw_exchange,
    run,
    running_env_server,
    scripted_client,
    wait_until,
)

ALLOWED_URL = "http://127.0.0.1:9/v1"
NO_RETRY = {"max_retries": 0, "timeout_s": 5.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("faults")
    args = ["--address", f"ipc://{tmp}/env.sock", "--pool", '{"min_workers": 1, "max_workers": 1, "multiplex": 64}',
            "--timeout", '{"rollout_s": 20, "kill_grace_s": 30}', "--env.args", '{"sleep": 0.5}',
            "--client-send-queue", "4096", "--client-stall-timeout-s", "1"]  # fmt: skip
    with running_env_server(tmp, *args) as running:
        yield running


def request(request_id: str, method: str, params: dict[str, Any] | None = None) -> list[bytes]:
    return [msgpack.packb({"id": request_id, "method": method, "params": params or {}})]


def rollout_request(request_id: str, task_idx: int) -> list[bytes]:
    return request(request_id, "run", {"task_idx": task_idx, "sampling": SAMPLING})


def test_a_cancel_sent_with_its_run_is_answered_cancelled_at_once_and_spares_the_worker(
    server: RunningServer,
) -> None:
    """Each run and its cancel land in one worker batch: the rollout is cancelled before its body
    runs. The answer must still come (within the 10 s receive timeout, far below kill_grace_s = 30)
    and the worker, with its other rollout, must be left alone."""
    workers = server.workers()
    messages = [rollout_request("other", SLEEP)]
    for i in range(20):
        messages += [rollout_request(f"v{i}", SLEEP), request(f"c{i}", "cancel", {"request_id": f"v{i}"})]
    by_id = {answer["id"]: answer for answer in raw_exchange(server.address, messages)}
    for i in range(20):
        assert by_id[f"v{i}"]["error"]["type"] == "cancelled", by_id[f"v{i}"]
        assert by_id[f"c{i}"]["result"] == {"cancelled": True}
    assert by_id["other"]["ok"] and by_id["other"]["result"]["traces"][0]["reward"] == 1.0
    assert server.workers() == workers


def test_a_trace_msgpack_cannot_carry_comes_back_as_an_error_trace(server: RunningServer) -> None:
    (answer,) = raw_exchange(server.address, [rollout_request("u", UNENCODABLE)])
    (trace,) = answer["result"]["traces"]
    assert trace["error"]["type"] == "unencodable_trace" and "set" in trace["error"]["message"]
    assert trace["task"]["idx"] == UNENCODABLE and trace["reward"] is None


@pytest.mark.parametrize(
    "client",
    [
        {"type": "eval", "base_url": "http://203.0.113.9/v1", "model": "m"},
        {"type": "eval", "base_url": ALLOWED_URL, "model": "m", "api_key_env": "HOME"},
        {"type": "scripted", "tokenizer": "/etc"},
    ],
)
def test_a_run_naming_a_client_of_its_own_is_refused_and_reaches_nothing(
    server: RunningServer, client: dict[str, Any]
) -> None:
    """A request cannot pick what a worker reaches (an URL, a key variable, a tokenizer): the
    client is the server's config, and a `run` carrying one is a bad_request naming the field."""
    params = {"task_idx": OK, "sampling": SAMPLING, "client": client}
    (answer,) = raw_exchange(server.address, [request("x", "run", params)])
    assert answer["error"]["type"] == "bad_request" and "params.client" in answer["error"]["message"]


def test_a_client_the_worker_cannot_build_answers_each_run_with_why(tmp_path: Path) -> None:
    """The key variable is unset in the server: building the client fails in each worker, and each
    run is answered with the reason (not a hang, not a dead worker)."""
    keyed = {
        "type": "eval",
        "base_url": ALLOWED_URL,
        "model": "m",
        "api_key_env": "ENVRL_TEST_UNSET_KEY",
        "retry": NO_RETRY,
    }
    os.environ.pop("ENVRL_TEST_UNSET_KEY", None)
    with running_env_server(tmp_path, client=keyed) as server:
        answers = raw_exchange(server.address, [rollout_request("k1", OK), rollout_request("k2", OK)])
    for answer in answers:
        assert answer["error"]["type"] == "bad_request"
        assert "ENVRL_TEST_UNSET_KEY (api_key_env) is not set" in answer["error"]["message"]


def test_a_client_that_stops_reading_is_dropped_and_its_requests_cancelled(server: RunningServer) -> None:
    context = zmq.Context.instance()
    stalled = context.socket(zmq.DEALER)
    stalled.setsockopt(zmq.LINGER, 0)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.connect(server.address)
    try:
        stalled.send_multipart(rollout_request("stalled-hang", HANG))
        for i in range(
            20_000
        ):  # 5 MB of `info` answers: 2 x 4096 queued, ~400 KB of socket buffers, the rest overflows
            stalled.send_multipart(request(f"i{i}", "info"))
        wait_until(lambda: "does not read its answers" in server.log_file.read_text(), 30, "the stalled client dropped")

        async def in_flight() -> int:
            async with scripted_client(server.address) as client:
                return (await client.info()).in_flight

        wait_until(lambda: run(in_flight()) == 0, 10, "the stalled client's hanging rollout cancelled")
    finally:
        stalled.close()


def test_a_client_that_reads_gets_every_answer_past_the_send_queue(server: RunningServer) -> None:
    """20,000 answers to one client that sends them in a burst and reads as it goes: none lost."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    dealer.connect(server.address)
    answered: set[str] = set()
    try:
        for i in range(20_000):
            dealer.send_multipart(request(f"r{i}", "info"))
            while dealer.poll(0):
                answered.add(msgpack.unpackb(dealer.recv())["id"])
        while len(answered) < 20_000:
            answered.add(msgpack.unpackb(dealer.recv())["id"])
    finally:
        dealer.close()
    assert answered == {f"r{i}" for i in range(20_000)}


def test_workers_killed_from_outside_before_ready_are_replaced_and_the_server_keeps_serving(tmp_path: Path) -> None:
    """Six replacement workers in a row SIGKILLed as soon as they appear (start-up takes far longer
    than the 50 ms poll): none is a start-up failure (3 in a row would stop the server)."""
    with running_env_server(tmp_path, "--pool", '{"min_workers": 1, "max_workers": 1}') as server:
        known = set(server.workers())
        os.kill(next(iter(known)), signal.SIGKILL)
        for _ in range(6):
            wait_until(lambda: bool(set(server.workers()) - known), 30, "a replacement worker")
            (pid,) = set(server.workers()) - known
            known.add(pid)
            os.kill(pid, signal.SIGKILL)

        async def go() -> Any:
            async with scripted_client(server.address) as client:
                await client.wait_until_ready(60)
                return await client.run(OK, sampling=SAMPLING)

        assert run(go())[0].reward == 1.0
        assert server.child.poll() is None
        outside = server.log_file.read_text().count("a kill from outside, not counted as a start-up failure")
        assert outside >= 4, server.log_file.read_text()[-3000:]
