"""`verifiers:<id>` served by envrl's env server, running in the example's own venv (verifiers 0.4).

Each rollout runs verifiers' null harness (a chat program talking to envrl's chat proxy) in a
child forked from a warm server of that program, and each env process imports verifiers (~8 s of
CPU), so the tests that use one model client share one server and keep to a few rollouts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from envrl.envclient.client import EnvClient, EnvServerError
from envrl.model.chat_tokens import chat_renderer
from tests.support.env_servers import RunningServer, alive, children, wait_until
from tests.support.standin_inference import serving
from tests.support.verifiers_env import (
    NULL_HARNESS,
    TIMEOUT,
    TOKENIZER,
    digit_share,
    run_group,
    verifiers_env_server,
)

REPLIES = ["12 13 14", "twelve"]
SCRIPTED = {"type": "scripted", "replies": REPLIES, "tokenizer": TOKENIZER}


DIGITS = {"taskset": {"num_tasks": 4}, "eval_taskset": {"num_tasks": 2, "seed": 1}, "agent": NULL_HARNESS}


@pytest.fixture(scope="module")
def digits_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The module's server, on `SCRIPTED` (the tiny model's tokenizer)."""
    with verifiers_env_server(tmp_path_factory.mktemp("verifiers"), DIGITS, client=SCRIPTED) as server:
        yield server


def test_verifiers_episodes_become_traces_with_every_model_call_as_a_token_turn(digits_server: RunningServer) -> None:
    traces = run_group(digits_server.address, 2)
    renderer = chat_renderer(TOKENIZER)
    assert sorted(t.turns[0].response["content"] for t in traces) == sorted(REPLIES)
    for trace in traces:
        assert trace.error is None, trace.error
        (turn,) = trace.turns
        # The prompt is verifiers' own (its taskset's system prompt and count), sent by its harness.
        assert [m["role"] for m in turn.prompt] == ["system", "user"]
        assert turn.prompt[1]["content"] == trace.task.data["prompt"]  # type: ignore[attr-defined]
        # The turn's tokens are the ones the client rendered and produced, not re-tokenised text.
        assert turn.tokens is not None
        assert turn.tokens.prompt_ids == renderer.prompt_ids(turn.prompt, None, None)
        assert turn.tokens.completion_ids == [*renderer.encode(turn.response["content"]), renderer.eos_id]
        # The reward is verifiers' own reward function's.
        assert trace.reward == pytest.approx(digit_share(turn.response["content"]))
        assert trace.metrics["digit_share"] == trace.reward


def test_the_eval_split_is_the_eval_taskset(digits_server: RunningServer) -> None:
    async def info() -> tuple[int, int]:
        async with EnvClient(digits_server.address, timeout=TIMEOUT) as env:
            served = await env.info()
            return served.num_tasks, served.num_eval_tasks

    assert asyncio.run(info()) == (4, 2)
    (trace,) = run_group(digits_server.address, 1, task_idx=1, split="eval")
    assert trace.error is None and trace.task.data["prompt"] == "261 262"  # type: ignore[attr-defined]  # seed 1's second count


@dataclass
class StandinServer:
    """A verifiers env server whose model client is a train client of `model`, a stand-in model
    server this test process runs: it refuses every request (HTTP 500) while `failing` is set,
    and otherwise holds each one unanswered until the module ends."""

    env: RunningServer
    failing: threading.Event


@pytest.fixture(scope="module")
def standin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandinServer]:
    """One env server for the tests of a model that fails and of one that never answers (the two
    cost one verifiers start-up instead of two); the failing test runs first, as the other one
    SIGKILLs the server's worker."""
    failing, release = threading.Event(), threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            if not failing.is_set():
                release.wait()
            self.send_error(500, "the stand-in model server refuses")

        do_GET = do_POST = answer  # http.server's names

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        try:
            client = {
                "type": "train",
                "base_url": url,
                "model": TOKENIZER,
                "retry": {"max_retries": 0, "timeout_s": 600},
            }
            env_args = {"taskset": {"num_tasks": 1}, "agent": NULL_HARNESS}
            with verifiers_env_server(tmp_path_factory.mktemp("standin"), env_args, client=client) as server:
                yield StandinServer(server, failing)
        finally:
            release.set()  # before `serving` joins its handler threads


def test_a_failing_model_call_gives_an_error_trace_that_names_it(standin_server: StandinServer) -> None:
    standin_server.failing.set()
    try:
        (trace,) = run_group(standin_server.env.address, 1)
    finally:
        standin_server.failing.clear()
    assert trace.reward is None and trace.stop_reason == "error" and trace.error is not None
    assert "chat proxy" in trace.error.message and "model call 0 failed" in trace.error.message, trace.error


def warm_processes(server: RunningServer) -> tuple[list[int], list[int]]:
    """The live warm servers of verifiers' chat program among the workers' descendants, and the
    runs forked from them (a run has its server's command line, and the server as its parent)."""
    servers, runs = [], []
    todo = [(pid, False) for pid in server.workers()]
    while todo:
        pid, forked = todo.pop()
        cmdline = b""
        with suppress(FileNotFoundError, ProcessLookupError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        is_server = not forked and b"warm/server.py" in cmdline and b"runtimes/scripts/" in cmdline
        if alive(pid) and (forked or is_server):
            (runs if forked else servers).append(pid)
        todo += [(child, is_server) for child in children(pid)]
    return servers, runs


def test_a_cancelled_rollout_stops_its_harness_program_and_a_killed_worker_takes_its_warm_server_along(
    standin_server: StandinServer,
) -> None:
    """One server whose model never answers in the test's time: a cancel stops the rollout's
    harness program and keeps the warm server; a SIGKILLed worker takes the warm server, its run
    and its socket directory along."""
    server = standin_server.env

    async def main() -> None:
        async with EnvClient(server.address, timeout=TIMEOUT) as env:
            sampling = {"max_tokens": 8}
            pending = asyncio.ensure_future(env.run(0, sampling=sampling, request_id="hang"))
            seen: list[tuple[list[int], list[int]]] = []

            def started() -> bool:  # one snapshot: the tree may change between two reads of it
                seen[:] = [warm_processes(server)]
                return [len(pids) for pids in seen[-1]] == [1, 1]

            await asyncio.to_thread(wait_until, started, 120, "one warm server running one harness program")
            (warm,), (program,) = seen[-1]
            assert await env.cancel("hang")
            with pytest.raises(EnvServerError) as raised:
                await pending
            assert raised.value.type == "cancelled"
            await asyncio.to_thread(wait_until, lambda: not alive(program), 30, "the harness program stopped")
            assert alive(warm)  # the warm server stays for the worker's next rollouts

            pending = asyncio.ensure_future(env.run(0, sampling=sampling))
            await asyncio.to_thread(wait_until, started, 120, "the next harness program started")
            (warm,), (program,) = warm_processes(server)
            socket_dir = Path(Path(f"/proc/{warm}/cmdline").read_bytes().split(b"\0")[3].decode()).parent
            (worker,) = server.workers()
            os.kill(worker, signal.SIGKILL)
            await asyncio.to_thread(wait_until, lambda: not alive(warm), 30, "the warm server exited")
            await asyncio.to_thread(wait_until, lambda: not alive(program), 30, "its run was killed")
            assert not socket_dir.exists()  # its socket and the runs' files went with it
            pending.cancel()
            with suppress(BaseException):
                await pending

    asyncio.run(main())


def test_a_verifiers_env_raising_in_its_rollout_gives_error_traces_and_keeps_serving(tmp_path: Path) -> None:
    args = {"agent": NULL_HARNESS}
    with verifiers_env_server(tmp_path, args, client=SCRIPTED, env_id="verifiers:vf-raising") as server:
        traces = run_group(server.address, 2)

        async def health() -> str:
            async with EnvClient(server.address, timeout=TIMEOUT) as env:
                return (await env.health()).status

        assert asyncio.run(health()) == "ok"
    for trace in traces:
        assert trace.reward is None and trace.stop_reason == "error"
        assert trace.error is not None and "raised on purpose" in trace.error.message, trace.error
        assert trace.num_turns == 1  # the model call before the failure is kept, with its tokens
        assert trace.turns[0].tokens is not None


def test_verifiers_turns_against_vllm_carry_the_policys_exact_tokens_and_logprobs(
    vllm_server: Any, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    client = {"type": "train", "base_url": vllm_server.base_url, "model": vllm_server.model}
    with verifiers_env_server(tmp_path, DIGITS, client=client) as server:
        traces = run_group(server.address, 2)
    renderer = chat_renderer(vllm_server.model)
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model, dtype=torch.float32).eval()
    for trace in traces:
        assert trace.error is None, trace.error
        (turn,) = trace.turns
        tokens = turn.tokens
        assert tokens is not None and 0 < len(tokens.completion_ids) <= 8
        assert tokens.prompt_ids == renderer.prompt_ids(turn.prompt, None, None)
        assert turn.response["content"] == renderer.decode(tokens.completion_ids)
        assert trace.reward == pytest.approx(digit_share(turn.response["content"]))
        # What vLLM sampled from, recomputed: temperature 1, no top-k/top-p, so the processed
        # logprobs are the model's log-softmax (float32 on both sides, as in test_envs_inference).
        ids = torch.tensor([tokens.prompt_ids + tokens.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(tokens.prompt_ids) - 1 : -1]
        expected = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens.completion_ids)[:, None])[:, 0]
        diffs = [abs(a - b) for a, b in zip(expected.tolist(), tokens.completion_logprobs, strict=True)]
        assert max(diffs) < 1e-4, diffs
