"""`verifiers:digits-tools`: a verifiers taskset with a per-rollout MCP toolset, served by envrl.

Each rollout gets its own tool server (verifiers starts it as `python -m digits_tools.tools`),
forked from the env worker's warm interpreter of that module instead of a fresh interpreter that
imports verifiers again; the harness offers its tool to the model, and nothing of a rollout's
tool server outlives the rollout. With a sandbox, the env must allow its tool servers on the
host (`tools_on_host = true`) or it is refused at load. One env server per test in the example's venv.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.env_servers import alive, children, cmdline, wait_until
from tests.support.verifiers_env import (
    NULL_HARNESS,
    TOKENIZER,
    digit_share,
    example_python,
    run_group,
    verifiers_env_server,
)

TOOL_MODULE = b"digits_tools.tools"


def test_each_rollout_gets_a_tool_server_forked_warm_and_none_outlives_its_rollout(tmp_path: Path) -> None:
    args = {"taskset": {"num_tasks": 4}, "agent": NULL_HARNESS}
    client = {"type": "scripted", "replies": ["12 13 14", "twelve"], "tokenizer": TOKENIZER}
    with verifiers_env_server(tmp_path, args, client=client, env_id="verifiers:digits-tools") as server:
        traces = run_group(server.address, 2) + run_group(server.address, 2, task_idx=1)
        (worker,) = server.workers()
        warm = [pid for pid in children(worker) if TOOL_MODULE in cmdline(pid) and b"warm/server.py" in cmdline(pid)]
        assert len(warm) == 1  # one warm interpreter of the toolset's module per worker
        # Every rollout's tool server was a fork of it, killed at the rollout's end:
        wait_until(lambda: not [p for p in children(warm[0]) if alive(p)], 10, "the tool servers are gone")
        fresh = [p for p in children(worker) if cmdline(p).split(b"\0")[1:3] == [b"-m", TOOL_MODULE]]
        assert fresh == []  # no fresh `python -m digits_tools.tools`
    for trace in traces:
        assert trace.error is None, trace.error
        (turn,) = trace.turns
        assert [t["function"]["name"] for t in turn.tools or []] == ["count_next_numbers"]  # offered to the model
        assert trace.reward == pytest.approx(digit_share(turn.response["content"]))
        assert trace.metrics["tool_calls"] == 0.0


def test_with_a_sandbox_an_env_with_host_tool_servers_is_refused_unless_it_says_tools_on_host() -> None:
    probe = (
        "from envrl.envs.adapters.verifiers import load_environment\n"
        "load_environment('digits-tools', sandbox={}, agent={'harness': {'id': 'null'}}, taskset={'num_tasks': 4})"
    )
    result = subprocess.run([example_python(), "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: verifiers:digits-tools: its tool servers (count) would run on the host")
    assert "tools_on_host = true" in last


def test_with_tools_on_host_a_sandboxed_episode_reaches_its_host_tool_server(tmp_path: Path) -> None:
    args = {"taskset": {"num_tasks": 4}, "agent": NULL_HARNESS, "sandbox": {"episode_s": 120}, "tools_on_host": True}
    client = {"type": "scripted", "replies": ["12 13 14"], "tokenizer": TOKENIZER}
    with verifiers_env_server(tmp_path, args, client=client, env_id="verifiers:digits-tools") as server:
        (trace,) = run_group(server.address, 1)
    assert trace.error is None, trace.error
    (turn,) = trace.turns
    assert [t["function"]["name"] for t in turn.tools or []] == ["count_next_numbers"]
    assert trace.reward == pytest.approx(digit_share(turn.response["content"]))
