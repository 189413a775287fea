"""Inference replicas from an env server's side: least-in-flight spreading, a rollout's later turns
on the replica that answered its earlier ones, reloads on every replica at once, and model access."""

import asyncio
import threading
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest

from envrl.data.layout import weights_dir
from envrl.model.chat_tokens import chat_renderer
from envrl.model.client import SamplingArgs, TrainClientConfig, build_client
from envrl.model.replicas import InferenceReplicas, ReplicaReloadError
from envrl.orchestrator.policy import PolicyTracker
from envrl.runtime.http import HttpCallError
from envrl.serve.protocol import ClientInfo
from envrl.transport.weights import ReplicaPolicyLoader
from tests.support.tiny_chat import TINY_CHAT
from tests.unit.model.test_model_client import FAST_RETRY, PromptTask, Recorder, TwoTurns, generated

REPLY = [5, 6, 7]


@pytest.fixture
def servers() -> Iterator[ExitStack]:
    """Every Recorder started with `serve(servers, handle)` is closed after the test."""
    with ExitStack() as stack:
        yield stack


def serve(stack: ExitStack, handle: Any) -> Recorder:
    return stack.enter_context(closing(Recorder(handle)))


def completion(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return 200, generated(REPLY, [-0.5] * 3)


def test_calls_go_to_the_replica_with_the_fewest_in_flight(servers: ExitStack) -> None:
    entered, release = threading.Event(), threading.Event()

    def held(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        entered.set()
        assert release.wait(30), "the test never released the held call"
        return completion(path, body)

    busy, idle = serve(servers, held), serve(servers, completion)

    async def main() -> None:
        replicas = InferenceReplicas([busy.url, idle.url], TINY_CHAT, retry=FAST_RETRY)
        try:
            held_call = asyncio.create_task(replicas.generate([1, 2], {}))
            assert await asyncio.to_thread(entered.wait, 30)
            for _ in range(4):
                await replicas.generate([1, 2], {})
            assert replicas.in_flight == [1, 0]
            release.set()
            await held_call
            assert replicas.in_flight == [0, 0]
            await replicas.generate([3], {})
            await replicas.generate([3], {})
        finally:
            release.set()
            await replicas.aclose()

    asyncio.run(main())
    assert len(busy.requests) == 2 and len(idle.requests) == 5, "4 calls while busy was busy; then one each in turn"


def test_a_rollouts_later_turns_go_to_the_replica_that_answered_its_first(
    servers: ExitStack,
) -> None:
    renderer = chat_renderer(TINY_CHAT)
    reply = renderer.encode("42") + [renderer.eos_id]

    def answer(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, generated(reply, [-0.5] * len(reply))

    first, second = serve(servers, answer), serve(servers, answer)
    env = TwoTurns(tasks=[PromptTask(idx=0, prompt="Guess."), PromptTask(idx=1, prompt="Again.")], max_turns=3)

    async def main() -> None:
        client = build_client(TrainClientConfig(base_url=[first.url, second.url], model=TINY_CHAT, retry=FAST_RETRY))
        try:
            for idx in (0, 1):
                trace = await env.run_rollout(env.get_task("train", idx), client, SamplingArgs(max_tokens=4))
                assert trace.error is None and trace.num_turns == 2
        finally:
            await client.aclose()

    asyncio.run(main())
    # Without stickiness the calls would alternate, each rollout's second turn on the other replica.
    for server in (first, second):
        (_, turn1), (_, turn2) = server.requests
        assert turn2["token_ids"][: len(turn1["token_ids"]) + len(reply)] == turn1["token_ids"] + reply


def test_weights_load_on_every_replica_at_once_and_a_failure_names_the_replica(
    servers: ExitStack, tmp_path: Path
) -> None:
    both_arrived = threading.Barrier(2, timeout=30)

    def loads(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        both_arrived.wait()  # breaks (and fails the test) unless both reloads are in flight together
        return 200, {"status": "ok"}

    def refuses(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        both_arrived.wait()
        return 400, {"error": "shape mismatch in lm_head.weight"}

    good, bad = serve(servers, loads), serve(servers, refuses)
    weights_dir(tmp_path, 1).mkdir(parents=True)

    async def main() -> None:
        replicas = InferenceReplicas([good.url, bad.url], TINY_CHAT, retry=FAST_RETRY)
        tracker = PolicyTracker(
            ReplicaPolicyLoader(replicas, tmp_path, timeout=10), max_async_level=0, timeout=10, keep=2
        )
        try:
            with pytest.raises(ReplicaReloadError) as failure:
                await tracker.ensure(1)
        finally:
            await replicas.aclose()
        message = str(failure.value)
        assert f"replica 1 ({bad.url})" in message and "1 of 2" in message and "shape mismatch" in message
        assert good.url not in message
        assert tracker.current == 0, "a step some replica did not load is not served"

    asyncio.run(main())
    assert [path for path, _ in good.requests] == ["/update_weights"]
    assert good.requests[0][1]["step"] == 1


def test_a_train_client_naming_replicas_reaches_every_one_and_info_shows_them() -> None:
    client = TrainClientConfig(base_url=["http://a:8000", "http://b:8001"], model=TINY_CHAT)
    assert client.base_urls == ["http://a:8000", "http://b:8001"]
    assert ClientInfo.of(client).base_urls == ["http://a:8000", "http://b:8001"]
    with pytest.raises(ValueError, match="base_url is an empty list"):
        TrainClientConfig(base_url=[], model="m")


def test_a_replica_that_does_not_answer_is_left_out_and_the_call_goes_to_another(servers: ExitStack) -> None:
    live = serve(servers, completion)
    dead = live.url.rsplit(":", 1)[0] + ":1"  # nothing listens on port 1

    async def main() -> None:
        replicas = InferenceReplicas([dead, live.url], TINY_CHAT, retry=FAST_RETRY)
        try:
            for _ in range(4):
                assert (await replicas.generate([1, 2], {})).completion_ids == REPLY
            assert replicas.pick() == 1  # the dead one stays out
        finally:
            await replicas.aclose()

    asyncio.run(main())
    assert len(live.requests) == 4


def test_a_reload_that_a_replica_did_not_answer_waits_for_it_and_loads_again(
    servers: ExitStack, tmp_path: Path
) -> None:
    def restarting(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        down = len(restarting_server.requests) <= FAST_RETRY.max_retries + 1  # every try of the first reload
        return (503, {"error": "starting"}) if down else (200, {"status": "ok"})

    restarting_server = serve(servers, restarting)
    weights_dir(tmp_path, 1).mkdir(parents=True)

    async def main() -> None:
        replicas = InferenceReplicas([restarting_server.url], TINY_CHAT, retry=FAST_RETRY)
        tracker = PolicyTracker(
            ReplicaPolicyLoader(replicas, tmp_path, timeout=10), max_async_level=0, timeout=10, keep=2
        )
        try:
            await tracker.ensure(1)
        finally:
            await replicas.aclose()
        assert tracker.current == 1

    asyncio.run(main())
    assert len(restarting_server.requests) == FAST_RETRY.max_retries + 2


def test_a_call_waits_for_a_replica_while_none_answers(servers: ExitStack) -> None:
    def restarting(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        down = len(restarting_server.requests) <= FAST_RETRY.max_retries + 1  # every try of the first attempt
        return (503, {"error": "starting"}) if down else completion(path, body)

    restarting_server = serve(servers, restarting)

    async def main() -> None:
        replicas = InferenceReplicas([restarting_server.url], TINY_CHAT, retry=FAST_RETRY)
        try:
            assert (await replicas.generate([1, 2], {})).completion_ids == REPLY
        finally:
            await replicas.aclose()

    asyncio.run(main())
    assert len(restarting_server.requests) == FAST_RETRY.max_retries + 2


def test_a_client_allowing_no_retry_fails_at_once_when_no_replica_answers(servers: ExitStack) -> None:
    down = serve(servers, lambda path, body: (503, {"error": "starting"}))

    async def main() -> None:
        replicas = InferenceReplicas([down.url], TINY_CHAT, retry=FAST_RETRY.model_copy(update={"max_retries": 0}))
        try:
            with pytest.raises(HttpCallError):
                await replicas.generate([1, 2], {})
        finally:
            await replicas.aclose()

    asyncio.run(main())
    assert len(down.requests) == 1  # one attempt, no wait for a restart
