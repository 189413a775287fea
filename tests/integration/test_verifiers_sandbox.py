"""`verifiers:<id>` with `sandbox`: each episode's harness program runs in an envrl sandbox of its
own (on the system python, in a venv of its PEP 723 dependencies), reaches verifiers' interception
server through a forwarded port, and leaves no sandbox behind; once the program is known, later
episodes get sandboxes started ahead with it running warm inside. One env server in the
example's venv (importing verifiers costs each env process ~8 s of CPU)."""

from __future__ import annotations

import asyncio
import threading
from contextlib import suppress
from pathlib import Path

import pytest

from envrl.data.traces import Trace
from envrl.envclient.client import EnvClient
from envrl.model.chat_tokens import chat_renderer
from tests.support.env_servers import cmdline, wait_until
from tests.support.sandboxes import ALL_SANDBOXES, processes_of, wait_gone
from tests.support.verifiers_env import (
    NULL_HARNESS,
    TIMEOUT,
    TOKENIZER,
    digit_share,
    verifiers_env_server,
)

REPLIES = ["12 13 14", "twelve"]
SANDBOXES_AHEAD = 4
"""envrl.envs.adapters.verifiers.SANDBOXES_AHEAD (verifiers is not installed in this venv)."""


def live_uids() -> set[int]:
    """The host uids of the sandboxes with a live process."""
    uids = set()
    for pid in processes_of(ALL_SANDBOXES):
        with suppress(FileNotFoundError):
            uids.add(Path(f"/proc/{pid}").stat().st_uid)
    return uids


def test_sandboxed_harness_programs_reach_the_model_with_exact_tokens_and_leave_nothing(tmp_path: Path) -> None:
    args = {"taskset": {"num_tasks": 4}, "agent": NULL_HARNESS, "sandbox": {"episode_s": 120}}
    # Each call waits a second, so the harness programs are seen running in their sandboxes.
    client = {"type": "scripted", "replies": REPLIES, "tokenizer": TOKENIZER, "delay_s": 1.0}
    seen: list[int] = []
    warm_servers: set[int] = set()
    with verifiers_env_server(tmp_path, args, client=client) as server:

        async def main() -> list[Trace]:
            async with EnvClient(server.address, timeout=TIMEOUT) as env:
                sampling = {"max_tokens": 8}
                first = await env.run(0, n=2, sampling=sampling, seed=5)
                # The program is now known: the next episode's sandbox request starts the pool
                # of sandboxes ahead (WarmPool fills on `create`), each with a warm server of it.
                return first + await env.run(1, n=2, sampling=sampling, seed=5)

        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                pids = processes_of(ALL_SANDBOXES)
                seen.append(len(pids))
                warm_servers.update(p for p in pids if b".envrl-warm.server.py" in cmdline(p))
                done.wait(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            traces = asyncio.run(main())
        finally:
            done.set()
            watcher.join()
        # The episodes' sandboxes are closed at their end (the last one's processes may still be
        # exiting when its trace is answered): what is left is the pool started ahead.
        few = lambda: len(live_uids()) <= SANDBOXES_AHEAD  # noqa: E731
        wait_until(few, 30, f"at most {SANDBOXES_AHEAD} sandboxes (those started ahead) live")
    assert wait_gone(ALL_SANDBOXES) == []  # and those die with the env server
    renderer = chat_renderer(TOKENIZER)
    assert max(seen) >= 4  # two sandboxes, each with its agent and the harness program (and more)
    assert warm_servers  # sandboxes started ahead ran a warm server of the harness program
    for trace in traces:
        assert trace.error is None, trace.error
        (turn,) = trace.turns
        assert turn.tokens is not None and turn.tokens.prompt_ids == renderer.prompt_ids(turn.prompt, None, None)
        assert trace.reward == pytest.approx(digit_share(turn.response["content"]))
