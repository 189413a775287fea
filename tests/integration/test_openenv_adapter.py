"""The OpenEnv adapter with the real openenv-core, in the example's own venv (deps/envs/openenv-count).

The env server runs in that venv (no torch there) and starts the OpenEnv server as its child;
rollouts use a scripted model, so no vLLM is needed (the vLLM tests are in test_adapters_inference.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from envrl.envclient.client import EnvClient
from tests.support.env_servers import RunningServer, alive, children, running_env_server, wait_until
from tests.support.other_user import needs_root

ROOT = Path(__file__).parents[2]
PROJECT = ROOT / "deps" / "envs" / "openenv-count"
PYTHON = PROJECT / ".venv" / "bin" / "python"
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
MAX_CONCURRENT_ENVS = 8  # openenv_count.server.MAX_CONCURRENT_ENVS
DIGITS = {"type": "scripted", "replies": ["12 13 14"], "delay_s": 0.05}
"""The module server's client: every reply scores 1.0; each call waits a little, so sessions are held."""
TOKENIZER = str(ROOT / "deps" / "models" / "tiny-chat")
POOL = '{"min_workers": 1, "max_workers": 1, "multiplex": 64}'

pytestmark = pytest.mark.skipif(
    not PYTHON.exists(), reason=f"the example's venv is missing: uv sync --project {PROJECT} --locked"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module (importing openenv-core's server takes ~10 s of CPU); the crash test runs last."""
    with running_env_server(
        tmp_path_factory.mktemp("openenv"), "--pool", POOL, "--timeout.rollout_s", "5", "--env.args", '{"turns": 2}',
        env_id="openenv-count", client=DIGITS, python=str(PYTHON), ready_timeout=300,
    ) as running:  # fmt: skip
        yield running


def openenv_child(server: RunningServer) -> int:
    """The pid of the OpenEnv server the env server started."""
    for pid in children(server.child.pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"envrl.envs.adapters.openenv" in f.read():
                return pid
    raise AssertionError(f"no OpenEnv child under env server {server.child.pid}")


def test_the_examples_venv_is_light() -> None:
    probe = "import importlib.util as u; print([m for m in ('torch', 'vllm', 'wandb') if u.find_spec(m)])"
    assert subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_each_completion_is_a_step_and_step_rewards_are_summed(server: RunningServer) -> None:
    async def run() -> None:
        async with EnvClient(server.address) as client:
            (trace,) = await client.run(3, sampling={"max_tokens": 8}, seed=0)
            assert trace.error is None, trace.error
            assert trace.num_turns == 2 and trace.stop_reason == "completed"
            assert [turn.response["content"] for turn in trace.turns] == ["12 13 14"] * 2
            assert trace.reward == pytest.approx(2.0)  # 1.0 for each step's "12 13 14"
            turns = trace.branches[0].turns
            assert turns[0].prompt[-1]["content"].split()[0].isdigit()  # the reset's observation
            assert turns[1].prompt[-1] == {"role": "user", "content": "More numbers."}

    asyncio.run(run())


def test_rollouts_beyond_the_servers_session_capacity_wait_instead_of_failing(server: RunningServer) -> None:
    async def run() -> None:
        async with EnvClient(server.address) as client:
            traces = [
                trace
                for traces in await asyncio.gather(
                    *(client.run(i, sampling={"max_tokens": 8}) for i in range(3 * MAX_CONCURRENT_ENVS))
                )
                for trace in traces
            ]
        assert [t.error for t in traces if t.error] == []
        assert all(t.reward == pytest.approx(2.0) for t in traces)
        assert max(t.metrics["openenv_wait_s"] for t in traces) > 0.05  # some waited for a free session

    asyncio.run(run())


def test_timed_out_rollouts_close_their_sessions(tmp_path: Path) -> None:
    """Rollouts cancelled at the rollout timeout hold every session; if one leaked, the next wave
    would wait for a session until its own timeout. Each call takes 10 s: a 2-turn rollout (20 s)
    runs past rollout_s = 18, a rollout stopped after its first turn by an episode budget of one
    token (10 s, and the wait for wave 1's sessions to close) does not."""
    stuck = {"type": "scripted", "replies": ["12 13 14"], "tokenizer": TOKENIZER, "delay_s": 10.0}
    with running_env_server(
        tmp_path, "--pool", POOL, "--timeout.rollout_s", "18", "--env.args", '{"turns": 2}',
        env_id="openenv-count", client=stuck, python=str(PYTHON), ready_timeout=300,
    ) as stuck_server:  # fmt: skip

        async def run() -> None:
            async with EnvClient(stuck_server.address) as client:
                timed_out = await asyncio.gather(
                    *(client.run(i, sampling={"max_tokens": 8}) for i in range(MAX_CONCURRENT_ENVS))
                )
                assert {t.error.type for (t,) in timed_out if t.error} == {"timeout"}
                one_turn = {"max_tokens": 8, "max_episode_tokens": 1}
                again = await asyncio.wait_for(
                    asyncio.gather(*(client.run(i, sampling=one_turn) for i in range(MAX_CONCURRENT_ENVS))),
                    timeout=60,
                )
                assert [t.error for (t,) in again if t.error] == []

        asyncio.run(run())


MCP_ROLLOUT = """
import asyncio, json
from envrl.envs import SamplingArgs, ScriptedClientConfig, load_environment
from envrl.model.client import ModelResponse, ScriptedClient

def call(i, name, arguments):
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}

CALLS = [call(1, "next_numbers", json.dumps({"last": 5, "n": 2})), call(2, "next_numbers", "{not json"), call(3, "nope", "{}")]

class ToolUser(ScriptedClient):
    async def generate(self, messages, sampling, *, tools=None, previous=None):
        self.calls += 1
        if self.calls == 1:
            return ModelResponse(message={"role": "assistant", "content": "", "tool_calls": CALLS}, finish_reason="tool_calls")
        return ModelResponse(message={"role": "assistant", "content": "6 7"}, finish_reason="stop")

async def main():
    env = load_environment("openenv-count", mcp=True)
    client = ToolUser(ScriptedClientConfig())
    trace = await env.run_rollout(env.get_task("train", 0), client, SamplingArgs(max_tokens=8), scoring_timeout=30)
    print(trace.model_dump_json())

asyncio.run(main())
"""
"""One in-process rollout of openenv-count in MCP mode, run in the example's venv: the model calls
a tool, a tool with arguments that are not JSON and an unknown tool, then answers."""


def test_mcp_mode_offers_the_servers_tools_and_answers_each_tool_call_with_its_result_or_error() -> None:
    done = subprocess.run([str(PYTHON), "-c", MCP_ROLLOUT], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    trace = json.loads(done.stdout.strip().splitlines()[-1])
    assert trace["error"] is None and trace["reward"] == 1.0  # the answer "6 7" through the `answer` tool
    first, second = trace["branches"][0]["turns"]
    assert [tool["function"]["name"] for tool in first["tools"]] == ["next_numbers", "answer"]
    replies = second["prompt"][-3:]
    assert [m["role"] for m in replies] == ["tool"] * 3 and [m["tool_call_id"] for m in replies] == ["c1", "c2", "c3"]
    assert replies[0]["content"] == "6 7"
    assert replies[1]["content"].startswith("error: the arguments are not JSON")
    assert replies[2]["content"] == "error: Unknown tool: 'nope'"


HOLD_SESSIONS = """
import base64, os, socket, sys, time
port, count, hold_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
held = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /ws HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n"
               f"Sec-WebSocket-Key: {key}\\r\\nSec-WebSocket-Version: 13\\r\\n\\r\\n").encode())
    print(s.recv(4096).split(b"\\r\\n", 1)[0].decode(), flush=True)
    held.append(s)
time.sleep(hold_s)
"""
"""Another local user's client: opens `count` OpenEnv sessions (a WebSocket handshake each) and holds them."""


def test_another_user_opens_no_session_on_the_envs_openenv_server(server: RunningServer) -> None:
    """Before: the OpenEnv server an env server starts served anyone on loopback; another user
    holding its `max_concurrent_envs` sessions made every rollout of the run wait until it timed out."""
    needs_root()
    port = next(c.laddr.port for c in psutil.Process(openenv_child(server)).net_connections() if c.status == "LISTEN")
    argv = [*AS_NOBODY, "/usr/bin/python3", "-c", HOLD_SESSIONS, str(port), str(MAX_CONCURRENT_ENVS), "30"]
    other = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        answers = [other.stdout.readline().strip() for _ in range(MAX_CONCURRENT_ENVS)]  # type: ignore[union-attr]

        async def run() -> list:
            async with EnvClient(server.address) as client:
                return await client.run(1, n=2, sampling={"max_tokens": 8})

        traces = asyncio.run(run())
    finally:
        other.kill()
        other.wait()
    assert not any(" 101 " in answer for answer in answers), answers
    assert [t.error for t in traces] == [None, None] and all(t.reward == pytest.approx(2.0) for t in traces)


def test_a_crashed_openenv_server_gives_error_traces_not_a_dead_env_server(server: RunningServer) -> None:
    pid = openenv_child(server)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), 10, "the OpenEnv server is dead")

    async def run() -> None:
        async with EnvClient(server.address) as client:
            traces = await client.run(0, n=4, sampling={"max_tokens": 8})
            assert {t.error.type for t in traces if t.error} == {"OpenEnvError"}
            assert all("cannot connect to the OpenEnv server" in t.error.message for t in traces if t.error)
            assert (await client.health()).status == "ok"

    asyncio.run(run())
