"""`verifiers:<id>` with `sandbox`: each episode's harness program runs in an envrl sandbox of its
own (on the system python, in a venv of its PEP 723 dependencies), reaches verifiers' interception
server through a forwarded port, and leaves no sandbox behind. One env server in the example's
venv (importing verifiers costs each env process ~8 s of CPU)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from envrl.envs.chat_tokens import chat_renderer
from envrl.serve.client import EnvClient
from envrl.traces import Trace
from tests.integration.sandboxes import ALL_SANDBOXES, processes_of, wait_gone
from tests.integration.verifiers_env import ACCESS, NULL_HARNESS, TIMEOUT, TOKENIZER, digit_share, verifiers_env_server

REPLIES = ["12 13 14", "twelve"]


def test_sandboxed_harness_programs_reach_the_model_with_exact_tokens_and_leave_nothing(tmp_path: Path) -> None:
    args = {"taskset": {"num_tasks": 4}, "agent": NULL_HARNESS, "sandbox": {"episode_s": 120}}
    # Each call waits a second, so the harness programs are seen running in their sandboxes.
    client = {"type": "scripted", "replies": REPLIES, "tokenizer": TOKENIZER, "delay": 1.0}
    seen: list[int] = []
    with verifiers_env_server(tmp_path, args, *ACCESS) as server:

        async def main() -> list[Trace]:
            async with EnvClient(server.address, timeout=TIMEOUT) as env:
                return await env.run_group(0, 2, client=client, sampling={"max_tokens": 8}, seed=5)  # type: ignore[arg-type]

        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                seen.append(len(processes_of(ALL_SANDBOXES)))
                done.wait(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            traces = asyncio.run(main())
        finally:
            done.set()
            watcher.join()
        assert wait_gone(ALL_SANDBOXES) == []  # closed at the episode's end, the server still up
    renderer = chat_renderer(TOKENIZER)
    assert max(seen) >= 4  # two sandboxes, each with its agent and the harness program (and more)
    for trace in traces:
        assert trace.error is None, trace.error
        (turn,) = trace.turns
        assert turn.tokens is not None and turn.tokens.prompt_ids == renderer.prompt_ids(turn.prompt, None, None)
        assert trace.reward == pytest.approx(digit_share(turn.response["content"]))
