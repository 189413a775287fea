"""The env server over real sockets: every method, concurrency, misbehaving envs, dying workers, bad frames.

One server (2 static workers x 4 rollouts, 4 queue slots, 2 s rollout timeout) is shared by the
module; tests that kill or stop servers start their own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import msgpack
import pytest

from envrl.envclient.client import EnvServerError
from tests.support.bad_envs import BEHAVIOURS, BURN, DIE, HANG, OK, RAISE, SLEEP
from tests.support.env_servers import (
    SAMPLING,
    RunningServer,
    alive,
    raw_exchange,
    rollout,
    run,
    running_env_server,
    scripted_client,
    wait_until,
)

POOL = '{"min_workers": 2, "max_workers": 2, "multiplex": 4}'
CAPACITY, MAX_QUEUED = 8, 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["--pool", POOL, "--max-queued", str(MAX_QUEUED), "--max-frame-bytes", "65536",
            "--timeout", '{"rollout_s": 2, "kill_grace_s": 1}', "--env.args", '{"sleep": 0.5}']  # fmt: skip
    with running_env_server(tmp_path_factory.mktemp("env-server"), *args) as running:
        yield running


def pool_back_to(server: RunningServer, workers: int) -> None:
    async def ready_workers() -> int:
        async with scripted_client(server.address) as client:
            return (await client.info()).workers

    wait_until(
        lambda: run(ready_workers()) == workers and len(server.workers()) == workers, 20, f"{workers} workers ready"
    )


def test_health_and_info_describe_the_server(server: RunningServer) -> None:
    async def go() -> None:
        async with scripted_client(server.address) as client:
            assert (await client.health()).status == "ok"
            info = await client.info()
            assert info.protocol_version == 3 and info.env_id == "bad_envs:load_environment"
            assert (info.num_tasks, info.num_eval_tasks, info.group_scoring) == (len(BEHAVIOURS), 1, False)
            assert (info.workers, info.capacity, info.max_queued, info.in_flight) == (2, CAPACITY, MAX_QUEUED, 0)

    run(go())


def test_run_returns_one_scored_trace_per_rollout_of_the_group(server: RunningServer) -> None:
    async def go() -> None:
        async with scripted_client(server.address) as client:
            trace = await rollout(client, OK)
            assert (trace.task.idx, trace.reward, trace.error) == (OK, 1.0, None)
            assert trace.turns[0].response["content"] == "hi"
            group = await client.run(OK, n=3, sampling=SAMPLING, seed=7)
            assert [t.reward for t in group] == [1.0, 1.0, 1.0]
            eval_trace = await rollout(client, 0, split="eval")
            assert eval_trace.reward == 1.0

    run(go())


def test_many_concurrent_requests_on_one_socket_are_each_answered_by_id(server: RunningServer) -> None:
    """Far more requests than capacity + queue: the client backs off on at_capacity; all finish."""

    async def go() -> None:
        async with scripted_client(server.address) as client:
            ids = [OK, OK, OK, SLEEP] * 12
            traces = await asyncio.gather(*(rollout(client, i) for i in ids))
            assert [t.task.idx for t in traces] == ids
            assert all(t.reward == 1.0 for t in traces)

    run(go())


def test_env_exception_comes_back_as_an_error_trace(server: RunningServer) -> None:
    async def go() -> None:
        async with scripted_client(server.address) as client:
            trace = await rollout(client, RAISE, request_id="raise-1")
            assert trace.error is not None and trace.error.type == "RuntimeError"
            assert "on purpose" in trace.error.message and trace.reward is None

    run(go())
    logged = [line for line in server.log_file.read_text().splitlines() if "req=raise-1" in line]
    assert logged and all("env-worker[" in line for line in logged)


def test_hanging_rollout_is_stopped_at_the_rollout_timeout(server: RunningServer) -> None:
    async def go() -> None:
        async with scripted_client(server.address) as client:
            trace = await rollout(client, HANG)
            assert trace.error is not None and trace.error.type == "timeout" and trace.is_truncated

    run(go())


def test_cpu_bound_rollout_gets_its_worker_killed_and_replaced(server: RunningServer) -> None:
    async def go() -> tuple[Any, Any]:
        async with scripted_client(server.address) as client:
            return await asyncio.gather(rollout(client, BURN), rollout(client, OK))

    stuck, fine = run(go())
    assert stuck.error.type == "timeout" and "stuck" in stuck.error.message
    assert fine.reward == 1.0
    pool_back_to(server, 2)


def test_cancel_stops_a_running_rollout_and_answers_it_cancelled(server: RunningServer) -> None:
    async def go() -> None:
        async with scripted_client(server.address) as client:
            hanging = asyncio.ensure_future(rollout(client, HANG, request_id="hang-1"))
            await asyncio.sleep(0.2)
            assert (await client.info()).in_flight == 1
            assert await client.cancel("hang-1") is True
            with pytest.raises(EnvServerError) as raised:
                await hanging
            assert raised.value.type == "cancelled"
            assert await client.cancel("hang-1") is False

            abandoned = asyncio.ensure_future(rollout(client, HANG))
            await asyncio.sleep(0.2)
            abandoned.cancel()  # cancelling the awaiting task sends `cancel` to the server
            for _ in range(100):
                if (await client.info()).in_flight == 0:
                    break
                await asyncio.sleep(0.05)
            assert (await client.info()).in_flight == 0

    run(go())


def test_sigkilled_worker_mid_rollout_its_requests_are_rerun_and_the_pool_refilled(server: RunningServer) -> None:
    async def go() -> list[Any]:
        async with scripted_client(server.address) as client:
            pending = [asyncio.ensure_future(rollout(client, SLEEP)) for _ in range(CAPACITY)]
            await asyncio.sleep(0.2)  # all running: 4 on each worker
            os.kill(server.workers()[0], signal.SIGKILL)
            return await asyncio.gather(*pending)

    traces = run(go())
    assert [t.reward for t in traces] == [1.0] * CAPACITY
    pool_back_to(server, 2)


def test_request_that_kills_every_worker_is_answered_worker_died(server: RunningServer) -> None:
    async def go() -> Any:
        async with scripted_client(server.address) as client:
            return await rollout(client, DIE)

    trace = run(go())
    assert trace.error.type == "worker_died" and trace.task.idx == DIE
    assert "re-run 2 times already, max_reruns = 2" in trace.error.message
    pool_back_to(server, 2)


def test_info_reports_the_servers_client_and_a_version_2_bind_is_refused(server: RunningServer) -> None:
    """The client is the server's config (`--client`): `info` shows it, `run` names none, and a
    `bind` (protocol 2) is a `bad_request` saying where the client went."""
    pack = msgpack.packb
    answers = raw_exchange(server.address, [
        [pack({"id": "a", "method": "run", "params": {"task_idx": OK, "sampling": SAMPLING}})],
        [pack({"id": "b", "method": "bind", "params": {"client": {"type": "eval", "base_url": "http://x/v1", "model": "m"}}})],
        [pack({"id": "c", "method": "info"})],
    ])  # fmt: skip
    ran, bound, info = sorted(answers, key=lambda answer: answer["id"])
    assert ran["ok"] and [t["reward"] for t in ran["result"]["traces"]] == [1.0]
    assert not bound["ok"] and bound["error"]["type"] == "bad_request"
    assert (
        "the model client is the server's config since protocol 3; start it with --client" in bound["error"]["message"]
    )
    assert info["result"]["client"] == {"type": "scripted", "base_urls": [], "model": None, "tokenizer": None}


def test_a_server_without_a_client_refuses_run_naming_the_option(tmp_path: Path) -> None:
    with running_env_server(tmp_path, client=None) as server:
        pack = msgpack.packb
        answers = raw_exchange(server.address, [
            [pack({"id": "a", "method": "run", "params": {"task_idx": OK, "sampling": SAMPLING}})],
            [pack({"id": "b", "method": "info"})],
        ])  # fmt: skip
    refused, info = sorted(answers, key=lambda answer: answer["id"])
    assert not refused["ok"] and refused["error"]["type"] == "bad_request"
    assert "has no model client" in refused["error"]["message"] and "--client" in refused["error"]["message"]
    assert info["ok"] and info["result"]["client"] is None


def test_info_and_logs_show_an_eval_client_without_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key variable's value, its name and `extra_body` stay out of `info` and the server's logs,
    also when a rollout's model call fails (nothing listens on port 9)."""
    secret, body_secret = "sk-test-never-shown", "body-secret-never-shown"
    monkeypatch.setenv("ENVRL_TEST_API_KEY", secret)
    client = {"type": "eval", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "ENVRL_TEST_API_KEY",
              "extra_body": {"token": body_secret}, "retry": {"max_retries": 0}}  # fmt: skip
    with running_env_server(tmp_path, client=client) as server:
        (info,) = raw_exchange(server.address, [[msgpack.packb({"id": "i", "method": "info"})]])
        request = {"id": "r", "method": "run", "params": {"task_idx": OK, "sampling": SAMPLING}}
        (ran,) = raw_exchange(server.address, [[msgpack.packb(request)]])
    assert info["result"]["client"] == {
        "type": "eval",
        "base_urls": ["http://127.0.0.1:9/v1"],
        "model": "m",
        "tokenizer": None,
    }
    assert ran["ok"] and ran["result"]["traces"][0]["error"] is not None
    shown = repr(info) + server.log_file.read_text() + (tmp_path / "env-server.out").read_text()
    assert secret not in shown and body_secret not in shown and "ENVRL_TEST_API_KEY" not in repr(info)


def test_malformed_oversized_and_unknown_requests_get_typed_errors(server: RunningServer) -> None:
    pack = msgpack.packb
    cases = {
        "not msgpack": ([b"\xc1\xc1\xc1"], "bad_request", None),
        "not a map": ([pack([1, 2])], "bad_request", None),
        "id not a string": ([pack({"id": 5, "method": "health"})], "bad_request", None),
        "two frames": ([pack({"id": "a", "method": "health"}), b"x"], "bad_request", "a"),
        "unknown method": ([pack({"id": "b", "method": "explode", "params": {}})], "unknown_method", "b"),
        "missing task_idx": ([pack({"id": "c", "method": "run", "params": {}})], "bad_request", "c"),
        "task out of range": (
            [pack({"id": "d", "method": "run", "params": {"task_idx": 99, "sampling": SAMPLING}})],
            "bad_request",
            "d",
        ),
        "bad sampling": (
            [
                pack(
                    {
                        "id": "e",
                        "method": "run",
                        "params": {"task_idx": 0, "sampling": {"max_tokens": "many"}},
                    }
                )
            ],
            "bad_request",
            "e",
        ),
        "oversized": ([pack({"id": "f", "method": "health", "params": {"pad": "x" * 70_000}})], "too_large", None),
        "split a list": (
            [pack({"id": "h", "method": "run", "params": {"split": [1], "task_idx": 0}})],
            "bad_request",
            "h",
        ),
        "cancel id a map": (
            [pack({"id": "i", "method": "cancel", "params": {"request_id": {"a": 1}}})],
            "bad_request",
            "i",
        ),
        "n huge": (
            [
                pack(
                    {
                        "id": "j",
                        "method": "run",
                        "params": {"task_idx": 0, "n": 2**64 - 1, "sampling": SAMPLING},
                    }
                )
            ],
            "bad_request",
            "j",
        ),
    }
    answers = raw_exchange(server.address, [frames for frames, _, _ in cases.values()])
    by_id = {a["id"]: a for a in answers if a["id"] is not None}
    anonymous = [a for a in answers if a["id"] is None]
    for name, (_, error_type, request_id) in cases.items():
        if request_id is not None:
            answer = by_id[request_id]
            assert not answer["ok"] and answer["error"]["type"] == error_type, name
    assert sorted(a["error"]["type"] for a in anonymous) == sorted(t for _, t, i in cases.values() if i is None)
    assert "sampling.max_tokens" in by_id["e"]["error"]["message"]
    assert "params.split" in by_id["h"]["error"]["message"] and "max_group_size" in by_id["j"]["error"]["message"]
    assert raw_exchange(server.address, [[pack({"id": "g", "method": "health"})]])[0]["result"]["status"] == "ok"


def test_requests_beyond_capacity_and_queue_get_at_capacity(server: RunningServer) -> None:
    offered = 4 * (CAPACITY + MAX_QUEUED)
    params = {"task_idx": SLEEP, "sampling": SAMPLING}
    request = {"method": "run", "params": params}
    answers = raw_exchange(server.address, [[msgpack.packb({"id": str(i), **request})] for i in range(offered)])
    rejected = [a for a in answers if not a["ok"]]
    assert all(a["error"]["type"] == "at_capacity" for a in rejected)
    assert len(answers) - len(rejected) == CAPACITY + MAX_QUEUED


def test_a_server_that_dies_fails_pending_calls_fast_takes_its_workers_along_and_is_reconnected_to(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        server = stack.enter_context(running_env_server(tmp_path / "first", "--pool", POOL))
        wait_until(lambda: len(server.workers()) == 2, 10, "two workers")
        workers = server.workers()

        async def go() -> float:
            async with scripted_client(server.address, health_interval=0.2, dead_after=1.0) as client:
                pending = asyncio.ensure_future(rollout(client, HANG))
                await asyncio.sleep(0.3)
                loop = asyncio.get_running_loop()
                killed_at = loop.time()
                server.child.kill()
                with pytest.raises(EnvServerError) as raised:
                    await pending
                assert raised.value.type == "unavailable"
                noticed_after = loop.time() - killed_at
                with pytest.raises(EnvServerError):  # new calls fail fast while it is gone
                    await rollout(client, OK)
                # A new server at the same address: the same client carries on.
                stack.enter_context(running_env_server(tmp_path / "second", "--address", server.address))
                await client.wait_until_ready(20)
                assert (await rollout(client, OK)).reward == 1.0
                return noticed_after

        assert run(go()) < 3.0
        wait_until(lambda: not any(alive(pid) for pid in workers), 5, "workers gone after their server was SIGKILLed")


def test_the_minimal_client_in_docs_protocol_md_works_as_written(server: RunningServer) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    code = doc.split("## A minimal client", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace("tcp://127.0.0.1:5000", server.address)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    answers = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert "'protocol_version': 3" in answers["1"] and "'reward': 1.0" in answers["2"]
