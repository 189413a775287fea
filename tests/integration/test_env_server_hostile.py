"""A hostile client on the node: frames written only from docs/protocol.md, to hurt. Every request
whose `id` can be read is answered under it, and nothing one client sends stops the server from
answering the others."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

from envrl.serve import protocol as p
from envrl.serve.protocol import WORKER_DONE, WORKER_READY
from envrl.serve.worker import WORKER_CONFIG_ENV
from tests.support.bad_envs import HANG
from tests.support.bad_envs import SLEEP as SLEEP_TASK
from tests.support.env_servers import SAMPLING, raw_exchange, running_env_server, wait_until

METHODS = ["health", "info", "bind", "run", "cancel", "reboot"]
PARAM_KEYS = ["task_idx", "split", "client", "model", "sampling", "seed", "n", "request_id", "retry", "type"]


def wrong_value(rng: random.Random, depth: int = 0) -> Any:
    """A value of a random type: scalars, lists, maps with string or non-string keys."""
    kinds = ["int", "float", "str", "bool", "none", "bytes"] + (["list", "map", "oddmap"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "list":
        return [wrong_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "map":
        return {rng.choice(PARAM_KEYS): wrong_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if kind == "oddmap":  # keys a request never has: ints, floats, booleans, None
        return {rng.choice([1, 2.5, True, None, -7]): wrong_value(rng, depth + 1) for _ in range(rng.randint(1, 2))}
    return {
        "int": rng.randint(-(2**40), 2**40),
        "float": rng.random(),
        "str": "x" * rng.randint(0, 8),
        "bool": True,
        "none": None,
        "bytes": b"\x00",
    }[kind]


def type_confused(rng: random.Random, i: int) -> bytes:
    params = {rng.choice(PARAM_KEYS): wrong_value(rng) for _ in range(rng.randint(0, 5))}
    return msgpack.packb({"id": f"fuzz-{i}", "method": rng.choice(METHODS), "params": params})


def test_every_type_confused_request_is_answered_under_its_own_id(tmp_path: Path) -> None:
    rng = random.Random(0)
    frames = [[type_confused(rng, i)] for i in range(3000)]
    with running_env_server(tmp_path, env_id="reverse-text") as server:
        answers = raw_exchange(server.address, frames)
        assert server.child.poll() is None, "the server died"
    ids = [answer["id"] for answer in answers]
    assert sorted(ids, key=str) == sorted((f"fuzz-{i}" for i in range(3000)), key=str), (
        f"{sum(i is None for i in ids)} answers without the request's id"
    )


def empty_array_bomb(size: int) -> bytes:
    """A request map whose params hold `size` bytes of empty arrays (one Python list per byte)."""
    count = size - 64
    return b"\x83\xa2id\xa4bomb\xa6method\xa4info\xa6params\x81\xa3pad\xdd" + count.to_bytes(4, "big") + b"\x90" * count


def test_a_client_sending_decode_bombs_does_not_stop_the_others_being_answered(tmp_path: Path) -> None:
    """Before: each 16 MiB frame of empty arrays held the broker for seconds, and clients waiting
    for anything (a health check) gave the server up as dead."""
    with running_env_server(tmp_path, env_id="reverse-text") as server:
        context = zmq.Context.instance()
        hostile = context.socket(zmq.DEALER)
        hostile.setsockopt(zmq.LINGER, 0)
        hostile.connect(server.address)
        try:
            for size in (16 * 2**20 - 1024, 1 * 2**20 - 1024, 900_000):
                for _ in range(2):
                    hostile.send(empty_array_bomb(size))
            answers = raw_exchange(
                server.address, [[msgpack.packb({"id": f"h{i}", "method": "health"})] for i in range(5)]
            )
        finally:
            hostile.close()
        assert [a["id"] for a in answers] == [f"h{i}" for i in range(5)] and all(a["ok"] for a in answers)
        assert server.child.poll() is None


def rollout_request(request_id: str, task_idx: int) -> bytes:
    params = {"task_idx": task_idx, "sampling": SAMPLING}
    return msgpack.packb({"id": request_id, "method": "run", "params": params})


def test_only_the_servers_own_workers_can_answer_on_its_worker_socket(tmp_path: Path) -> None:
    """A process on the node that learned the worker socket's path (every local user can list
    bound unix sockets in /proc/net/unix; here it is read from a worker's environment) answers a
    running rollout with a forged reward, then says `ready` under a made-up name.
    Before: the forged answer reached the client, and the `ready` crashed the server."""
    args = ["--pool", '{"min_workers": 1, "max_workers": 1}', "--env.args", '{"sleep": 1.0}']
    with running_env_server(tmp_path, *args) as server:
        [worker] = server.workers()
        environ = dict(v.split("=", 1) for v in Path(f"/proc/{worker}/environ").read_text().split("\0") if "=" in v)
        address = json.loads(environ[WORKER_CONFIG_ENV])["address"]
        forged = msgpack.packb({"id": "slow", "ok": True, "result": {"reward": 999.0}})
        context = zmq.Context.instance()
        client = context.socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.setsockopt(zmq.RCVTIMEO, 30_000)
        client.connect(server.address)
        stranger = context.socket(zmq.DEALER)
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.setsockopt(zmq.IDENTITY, b"not-a-worker")
        stranger.connect(address)
        try:
            client.send(rollout_request("slow", SLEEP_TASK))
            time.sleep(0.3)  # the rollout is running (it sleeps 1 s); forge its answer now
            for token in range(8):
                stranger.send_multipart([WORKER_DONE, msgpack.packb([token]), forged])
            stranger.send(WORKER_READY)
            answer = msgpack.unpackb(client.recv())
        finally:
            client.close()
            stranger.close()
        assert answer["id"] == "slow" and answer["ok"] and answer["result"]["traces"][0]["reward"] == 1.0, answer
        assert server.child.poll() is None, "the server died"
        assert "from an unknown peer" in server.log_file.read_text()


def info(address: str) -> dict[str, Any]:
    [answer] = raw_exchange(address, [[msgpack.packb({"id": "info", "method": "info"})]])
    return answer["result"]


def test_unanswered_requests_are_bounded_by_bytes_per_client_and_in_total(tmp_path: Path) -> None:
    """Before: accepted requests were bounded by count only, whatever their frames' size. What the
    server holds of a request is its worker's frame (`encode_work`), about the request's size."""
    pad = "x" * 400  # request ids are free-form strings: a frame of about 500 bytes
    params = p.RunParams.model_validate({"task_idx": SLEEP_TASK, "sampling": SAMPLING})
    size = len(p.encode_work(f"r00{pad}", params))
    args = ["--pool", '{"min_workers": 1, "max_workers": 1}', "--env.args", '{"sleep": 30.0}',
            "--max-client-bytes", str(4 * size), "--max-pending-bytes", str(6 * size)]  # fmt: skip
    with running_env_server(tmp_path, *args) as server:
        context = zmq.Context.instance()
        first, second = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
        try:
            for sock in (first, second):
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.RCVTIMEO, 10_000)
                sock.connect(server.address)
            for i in range(5):
                first.send(rollout_request(f"r{i:02d}{pad}", SLEEP_TASK))
            refused = msgpack.unpackb(first.recv())
            for i in range(10, 13):
                second.send(rollout_request(f"r{i:02d}{pad}", SLEEP_TASK))
            refused_in_total = msgpack.unpackb(second.recv())
        finally:
            first.close()
            second.close()
    assert refused["id"] == f"r04{pad}" and refused["error"]["type"] == "at_capacity", refused
    assert "max_client_bytes" in refused["error"]["message"]
    assert refused_in_total["id"] == f"r12{pad}" and refused_in_total["error"]["type"] == "at_capacity", (
        refused_in_total
    )
    assert "max_pending_bytes" in refused_in_total["error"]["message"]


def test_a_departed_clients_requests_are_cancelled(tmp_path: Path) -> None:
    """A client sends a hanging rollout, a sleeping one and four more hanging ones (queued), then
    closes its connection. Before: the server ran them all for nobody, holding their frames."""
    args = ["--pool", '{"min_workers": 1, "max_workers": 1, "multiplex": 2}', "--env.args", '{"sleep": 1.0}']
    with running_env_server(tmp_path, *args) as server:
        context = zmq.Context.instance()
        client = context.socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.connect(server.address)
        try:
            for i, task in enumerate([HANG, SLEEP_TASK, HANG, HANG, HANG, HANG]):
                client.send(rollout_request(f"gone-{i}", task))
            wait_until(lambda: info(server.address)["queued"] == 4, 10.0, "4 requests queued behind 2 running")
        finally:
            client.close()
        # the sleeping rollout's answer finds the client gone: the rest are cancelled, running or queued
        wait_until(lambda: "its connection is closed" in server.log_file.read_text(), 30.0, "the departed client seen")
        wait_until(lambda: (info(server.address)["queued"], info(server.address)["in_flight"]) == (0, 0), 30.0,
                   "the departed client's requests cancelled")  # fmt: skip
        assert server.child.poll() is None
