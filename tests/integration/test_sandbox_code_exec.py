"""The code-exec example env: rollouts run their code only in sandboxes, in process and behind an
env server, and no sandbox outlives its rollout, its worker or its server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from envrl.data.traces import Message
from envrl.envclient.client import EnvClient
from envrl.envs.registry import load_environment
from envrl.model.client import SamplingArgs, ScriptedClient, ScriptedClientConfig
from tests.support.env_servers import running_env_server, wait_until
from tests.support.sandbox_attacks import answer, forge_program, plant_at_verdict
from tests.support.sandboxes import ALL_SANDBOXES, processes_of, wait_gone


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "run_python", "arguments": {"code": code}}) + "</tool_call>"


def _rollout(replies: list[str], **env_args: Any):
    env = load_environment("code-exec", **env_args)
    task = env.get_task("train", 0)
    client = ScriptedClient(ScriptedClientConfig(replies=replies))
    trace = asyncio.run(env.run_rollout(task, client, SamplingArgs(max_tokens=64), scoring_timeout=30))
    return task, trace


def test_a_program_that_prints_the_target_earns_1_and_leaves_nothing() -> None:
    env = load_environment("code-exec")
    target = env.get_task("train", 0).target
    seen: list[Message] = []

    def respond(messages: list[Message]) -> str:
        seen[:] = messages
        if len(messages) == 2:
            return _call("import os; print(os.getuid(), sorted(os.environ))")
        return f"```python\nprint({target!r})\n```"

    client = ScriptedClient(ScriptedClientConfig(replies=[]), respond=respond)
    trace = asyncio.run(
        env.run_rollout(env.get_task("train", 0), client, SamplingArgs(max_tokens=64), scoring_timeout=30)
    )
    assert trace.error is None and trace.reward == 1.0, trace.error
    assert "65534" in seen[-1]["content"] and "exit code 0" in seen[-1]["content"]
    assert wait_gone(ALL_SANDBOXES) == []


def test_a_wrong_or_hostile_program_earns_0_not_an_error() -> None:
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nprint('nope')"
    task, trace = _rollout([_call(daemon), f"```python\n{daemon}\n```"])
    assert trace.error is None and trace.reward == 0.0
    assert wait_gone(ALL_SANDBOXES) == []


def test_a_sandbox_that_cannot_start_is_a_typed_error_trace_never_a_reward(tmp_path: Path) -> None:
    task, trace = _rollout(["print(1)"], sandbox={"image": ["/usr", str(tmp_path)]})
    assert trace.reward is None and trace.error is not None and trace.error.type == "sandbox_start"


def test_the_episode_cap_is_a_typed_error_trace_never_a_reward() -> None:
    task, trace = _rollout([_call("import time; time.sleep(30)")], sandbox={"episode_s": 1.5})
    assert trace.reward is None and trace.error is not None and trace.error.type == "sandbox_timeout"
    assert wait_gone(ALL_SANDBOXES) == []


SLOW_MODEL = {"type": "scripted", "replies": [_call("print(1)"), "```python\nprint(1)\n```"], "delay_s": 1.0}


def test_the_env_server_serves_sandboxed_rollouts_and_sigkills_leave_no_sandbox(tmp_path: Path) -> None:
    pool = '{"min_workers": 1, "max_workers": 1}'
    with running_env_server(
        tmp_path, "--pool", pool, env_id="code-exec", client=SLOW_MODEL, ready_timeout=120
    ) as server:

        async def go() -> None:
            async with EnvClient(server.address) as client:
                traces = await asyncio.gather(*(client.run(i, sampling={"max_tokens": 64}) for i in range(4)))
                assert all(t.error is None and t.reward is not None for (t,) in traces), [t.error for (t,) in traces]
                assert wait_gone(ALL_SANDBOXES) == []
                # SIGKILL the worker while its sandboxes live: they die with it; the rollouts are
                # answered (re-run on the replacement worker), and the next one is served.
                pending = [asyncio.ensure_future(client.run(i, sampling={"max_tokens": 64})) for i in range(3)]
                await asyncio.to_thread(
                    wait_until, lambda: len(processes_of(ALL_SANDBOXES)) >= 3, 30, "sandboxes started"
                )
                (worker,) = server.workers()
                os.kill(worker, signal.SIGKILL)
                assert await asyncio.to_thread(wait_gone, ALL_SANDBOXES, 10) == []
                for (trace,) in await asyncio.gather(*pending):
                    assert trace.error is None or trace.error.type == "worker_died"
                (trace,) = await client.run(0, sampling={"max_tokens": 64})
                assert trace.error is None and trace.reward is not None
                # SIGKILL the server itself while a sandbox lives: its worker and the sandbox follow.
                lost = asyncio.ensure_future(client.run(1, sampling={"max_tokens": 64}))
                await asyncio.to_thread(
                    wait_until, lambda: len(processes_of(ALL_SANDBOXES)) >= 3, 30, "sandbox started"
                )
                server.workers()
                server.child.popen.kill()
                lost.cancel()
            assert await asyncio.to_thread(wait_gone, ALL_SANDBOXES, 30) == []

        asyncio.run(go())


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the forgery sets x86_64 registers")
def test_a_program_that_forges_its_verdict_with_ptrace_earns_0() -> None:
    """Issue 37: a run_python call ptraces bubblewrap's pid 1 into writing the answers to the
    verdict's requests ahead of the agent (write final.py, run it: prints the target), and the
    final program prints something else; the old code scored it 1.0."""
    env = load_environment("code-exec")
    target = env.get_task("train", 0).target
    forgery = forge_program([answer("ok\n"), {}, answer(f"{target}\n")])
    task, trace = _rollout([_call(forgery), "```python\nprint('I do not know')\n```"])
    assert trace.error is None and trace.reward == 0.0, (trace.error, trace.reward)
    assert wait_gone(ALL_SANDBOXES) == []


def test_a_fifo_and_symlinks_planted_at_the_verdict_by_earlier_daemons_do_not_forge_it() -> None:
    """Issue 53: daemons left by a tool call plant a FIFO at final.py (taking the host's write and
    renaming their own program over it) and symlinks to that program in every new directory; the
    final program prints something else; before the clean room this scored 1.0."""
    target = load_environment("code-exec").get_task("train", 0).target
    task, trace = _rollout([_call(plant_at_verdict(target)), "```python\nprint('I do not know')\n```"])
    assert trace.error is None and trace.reward == 0.0, (trace.error, trace.reward)
    task, trace = _rollout([_call(plant_at_verdict("wrong")), f"```python\nprint({target!r})\n```"])
    assert trace.error is None and trace.reward == 1.0, (trace.error, trace.reward)
    assert wait_gone(ALL_SANDBOXES) == []


def test_a_program_that_kills_its_sandbox_in_a_tool_call_or_the_verdict_earns_0_not_an_error() -> None:
    """An error Trace leaves the group's baseline: a model that cannot print the target would
    abstain instead of scoring 0 by killing the agent that runs its code (red-team pass, issue 53)."""
    abstain = "import os, signal\nos.kill(-1, signal.SIGKILL)"
    for replies in ([f"```python\n{abstain}\n```"], [_call(abstain), _call("print(1)"), "```python\nprint(1)\n```"]):
        task, trace = _rollout(replies)
        assert trace.error is None and trace.reward == 0.0, (trace.error, trace.reward)
    assert wait_gone(ALL_SANDBOXES) == []
