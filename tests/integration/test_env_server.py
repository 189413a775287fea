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

from envrl.serve.client import EnvClient, EnvServerError
from tests.support.bad_envs import BEHAVIOURS, BURN, DIE, HANG, OK, RAISE, SLEEP
from tests.support.env_servers import (
    SAMPLING,
    SCRIPTED,
    RunningServer,
    alive,
    bind,
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
            assert info.protocol_version == 2 and info.env_id == "bad_envs:load_environment"
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


def test_a_model_is_bound_once_and_runs_name_it_by_id(server: RunningServer) -> None:
    """Equal clients share one id; a run naming no binding gets `unknown_model`; a client the
    server's `model_access` does not allow is refused at `bind`."""
    model = bind(server.address)
    assert bind(server.address, dict(SCRIPTED)) == model != bind(server.address, {"type": "scripted", "replies": ["x"]})
    run_params = {"task_idx": OK, "sampling": SAMPLING}
    pack = msgpack.packb
    answers = raw_exchange(server.address, [
        [pack({"id": "a", "method": "run", "params": {**run_params, "model": model}})],
        [pack({"id": "b", "method": "run", "params": {**run_params, "model": "0123456789abcdef"}})],
        [pack({"id": "c", "method": "bind", "params": {"client": {"type": "eval", "base_url": "http://x/v1", "model": "m"}}})],
    ])  # fmt: skip
    ran, unknown, refused = sorted(answers, key=lambda answer: answer["id"])
    assert ran["ok"] and [t["reward"] for t in ran["result"]["traces"]] == [1.0]
    assert not unknown["ok"] and unknown["error"]["type"] == "unknown_model"
    assert not refused["ok"] and refused["error"]["type"] == "bad_request"
    assert "model_access.base_urls" in refused["error"]["message"]


def test_clients_of_different_models_share_one_server_each_with_its_own_model(server: RunningServer) -> None:
    """Two orchestrators on one server: each binds its own model and its rollouts use it."""

    async def go() -> tuple[list[str], list[str]]:
        models = [{"type": "scripted", "replies": [reply]} for reply in ("first", "second")]
        async with EnvClient(server.address, model=models[0]) as a, EnvClient(server.address, model=models[1]) as b:
            runs = await asyncio.gather(*(client.run(OK, n=2, sampling=SAMPLING) for client in (a, b, a, b)))
        replies = [[t.turns[0].response["content"] for t in traces] for traces in runs]
        return replies[0] + replies[2], replies[1] + replies[3]

    assert run(go()) == (["first"] * 4, ["second"] * 4)


def test_malformed_oversized_and_unknown_requests_get_typed_errors(server: RunningServer) -> None:
    pack = msgpack.packb
    model = bind(server.address)
    cases = {
        "not msgpack": ([b"\xc1\xc1\xc1"], "bad_request", None),
        "not a map": ([pack([1, 2])], "bad_request", None),
        "id not a string": ([pack({"id": 5, "method": "health"})], "bad_request", None),
        "two frames": ([pack({"id": "a", "method": "health"}), b"x"], "bad_request", "a"),
        "unknown method": ([pack({"id": "b", "method": "explode", "params": {}})], "unknown_method", "b"),
        "missing task_idx": ([pack({"id": "c", "method": "run", "params": {}})], "bad_request", "c"),
        "task out of range": (
            [pack({"id": "d", "method": "run", "params": {"task_idx": 99, "model": model, "sampling": SAMPLING}})],
            "bad_request",
            "d",
        ),
        "bad sampling": (
            [
                pack(
                    {
                        "id": "e",
                        "method": "run",
                        "params": {"task_idx": 0, "model": model, "sampling": {"max_tokens": "many"}},
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
                        "params": {"task_idx": 0, "n": 2**64 - 1, "model": model, "sampling": SAMPLING},
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
    params = {"task_idx": SLEEP, "model": bind(server.address), "sampling": SAMPLING}
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
    assert "'protocol_version': 2" in answers["1"] and "'reward': 1.0" in answers["3"]
