"""A black-box agent program run in a sandbox: each test is a real attempt by the program, each
contained. The program reaches the model only through the chat proxy's forwarded port; it sees
nothing of the worker's environment or home, connects nowhere else, and nothing of it outlives its
episode or its timeout. Programs here use the standard library on the system python (no venv)."""

from __future__ import annotations

import asyncio
import os
import socket
import textwrap
import uuid
from pathlib import Path
from typing import Any

from envrl.data.traces import Task, Trace
from envrl.envs import Rubric
from envrl.envs.adapters.agent_program import AgentProgramEnvironment
from envrl.model.client import SamplingArgs, ScriptedClient, ScriptedClientConfig
from envrl.sandbox import SandboxConfig, bridge
from tests.support.sandboxes import ALL_SANDBOXES, run_dir, wait_gone

__all__ = ["run_dir"]

TOKENIZER = "deps/models/tiny-chat"
CHAT = """
import json, os, urllib.request
def chat(messages):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": messages}).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    return json.load(urllib.request.urlopen(request, timeout=30))["choices"][0]["message"]["content"]
"""


class Question(Task):
    question: str


def answered(answer: str | None) -> float:
    return float(bool(answer))


def _rollout(program: str, replies: list[str] | None = None, **kwargs: Any) -> tuple[Trace, str]:
    """The rollout's Trace and what the program printed."""
    printed: list[str] = []

    async def keep(answer: str | None) -> float:  # async: runs in this process (sync ones run forked)
        printed.append(answer or "")
        return answered(answer)

    env = AgentProgramEnvironment(
        command=["python3", "agent.py"],
        files={"agent.py": CHAT + textwrap.dedent(program)},
        tasks=[Question(idx=0, question="Write some numbers.")],
        rubric=Rubric({keep: 1.0}),
        sandbox=SandboxConfig(),
        **kwargs,
    )

    async def main() -> Trace:
        client = ScriptedClient(ScriptedClientConfig(replies=replies or ["12 34", "5678"], tokenizer=TOKENIZER))
        try:
            return await env.run_rollout(
                env.get_task("train", 0), client, SamplingArgs(max_tokens=8), scoring_timeout=30
            )
        finally:
            await env.aclose()

    trace = asyncio.run(main())
    return trace, "".join(printed)


def test_a_sandboxed_program_reaches_the_model_through_the_proxy_with_exact_tokens(run_dir: Path) -> None:
    bridges = set(bridge.bridges_root().iterdir())  # other processes' sandboxes may have theirs
    trace, _ = _rollout(
        """
        task = json.load(open(0))
        messages = [{"role": "user", "content": task["question"]}]
        draft = chat(messages)
        messages += [{"role": "assistant", "content": draft}, {"role": "user", "content": "Now only the numbers."}]
        print(chat(messages))
        """
    )
    assert trace.error is None, trace.error
    assert trace.reward == 1.0 and trace.num_turns == 2 and len(trace.branches) == 1
    draft, revision = trace.turns
    assert draft.prompt == [{"role": "user", "content": "Write some numbers."}]
    context = draft.tokens.prompt_ids + draft.tokens.completion_ids
    assert revision.tokens.prompt_ids[: len(context)] == context  # the revision extends the draft's tokens
    assert revision.response["content"] == "5678"
    assert wait_gone(ALL_SANDBOXES) == []
    assert set(bridge.bridges_root().iterdir()) <= bridges  # the sandbox's bridge directory is gone


def test_a_sandboxed_program_cannot_read_the_workers_environment_or_home(run_dir: Path) -> None:
    secret = f"envrl-secret-{uuid.uuid4().hex}"
    home_file = Path.home() / f".envrl-agent-secret-{uuid.uuid4().hex}"
    home_file.write_text(secret)
    os.environ["ENVRL_TEST_SECRET"] = secret
    try:
        trace, printed = _rollout(
            f"""
            import glob
            seen = [repr(dict(os.environ))]
            for path in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline") + [{str(home_file)!r}]:
                try:
                    seen.append(open(path, "rb").read().decode(errors="replace"))
                except OSError as e:
                    seen.append(type(e).__name__)
            print(chat([{{"role": "user", "content": "hi"}}]))
            print("\\n".join(seen))
            """
        )
    finally:
        del os.environ["ENVRL_TEST_SECRET"]
        home_file.unlink()
    assert trace.error is None, trace.error
    answer = trace.turns[0].response["content"]
    assert answer == "12 34" and trace.reward == 1.0
    assert secret not in printed + trace.model_dump_json()
    assert "OPENAI_BASE_URL" in printed and "FileNotFoundError" in printed  # it ran, and the home file is absent
    assert wait_gone(ALL_SANDBOXES) == []


def test_a_sandboxed_program_cannot_connect_out_over_tcp_but_to_the_proxy(run_dir: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        trace, printed = _rollout(
            f"""
            import socket
            results = []
            for host, port in [("127.0.0.1", {port}), ("10.0.0.1", 80), ("1.1.1.1", 443), ("::1", {port})]:
                try:
                    socket.create_connection((host, port), timeout=2).close()
                    results.append("CONNECTED %s:%s" % (host, port))
                except OSError as e:
                    results.append("blocked " + type(e).__name__)
            raw = socket.socket(socket.AF_UNIX)
            raw.connect("/run/envrl-bridge/bridge.sock")  # the bridge itself, naming a port it was not given
            raw.sendall(b"{port}\\nGET / HTTP/1.0\\r\\n\\r\\n")
            results.append("bridge answered %r" % raw.recv(100))
            print(chat([{{"role": "user", "content": "hi"}}]), *results)
            """
        )
        try:
            listener.accept()
            accepted = True
        except BlockingIOError:
            accepted = False
    finally:
        listener.close()
    assert trace.error is None, trace.error
    assert "CONNECTED" not in printed and not accepted and printed.count("blocked") == 4, printed
    assert "bridge answered b''" in printed  # the host closed it unanswered
    assert trace.turns[0].response["content"] == "12 34"  # while the proxy's port was reached
    assert wait_gone(ALL_SANDBOXES) == []


def test_nothing_of_a_sandboxed_program_outlives_its_episode(run_dir: Path) -> None:
    trace, _ = _rollout(
        """
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                import time
                time.sleep(600)
            os._exit(0)
        print(chat([{"role": "user", "content": "hi"}]))
        """
    )
    assert trace.error is None and trace.reward == 1.0, trace.error
    assert wait_gone(ALL_SANDBOXES) == []


def test_a_sandboxed_program_past_its_timeout_is_an_error_trace_and_leaves_nothing(run_dir: Path) -> None:
    trace, _ = _rollout(
        """
        import subprocess, time
        subprocess.Popen(["python3", "-c", "import time; time.sleep(600)"], start_new_session=True)
        chat([{"role": "user", "content": "hi"}])
        time.sleep(600)
        """,
        timeout_s=3.0,
    )
    assert trace.reward is None and trace.error is not None and trace.error.type == "agent_timeout", trace.error
    assert trace.num_turns == 1  # the call it made before hanging is kept
    assert wait_gone(ALL_SANDBOXES) == []


def test_a_sandboxed_program_that_exits_non_zero_is_an_error_trace(run_dir: Path) -> None:
    trace, _ = _rollout("import sys; sys.stderr.write('boom'); sys.exit(3)")
    assert trace.reward is None and trace.error is not None
    assert trace.error.type == "agent_exit" and "exited with 3" in trace.error.message and "boom" in trace.error.message
    assert wait_gone(ALL_SANDBOXES) == []


def test_a_sandbox_that_cannot_start_is_a_typed_error_trace(run_dir: Path, tmp_path: Path) -> None:
    env = AgentProgramEnvironment(
        command=["python3", "agent.py"],
        tasks=[Question(idx=0, question="q")],
        rubric=Rubric({answered: 1.0}),
        sandbox=SandboxConfig(python=tmp_path / "no-such-python", image=[Path("/usr"), tmp_path]),
    )
    client = ScriptedClient(ScriptedClientConfig(replies=["x"]))
    trace = asyncio.run(env.run_rollout(env.get_task("train", 0), client, SamplingArgs(max_tokens=8)))
    asyncio.run(env.aclose())
    assert trace.reward is None and trace.error is not None and trace.error.type == "sandbox_start", trace.error
