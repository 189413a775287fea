"""`verifiers:digits-tools`: a verifiers taskset with a per-rollout MCP toolset, served by envrl.

Each rollout gets its own tool server (verifiers starts it as `python -m digits_tools.tools`),
forked from the env worker's warm interpreter of that module instead of a fresh interpreter that
imports verifiers again; the harness offers its tool to the model, and nothing of a rollout's
tool server outlives the rollout. One env server in the example's venv.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.env_servers import alive, children, wait_until
from tests.support.verifiers_env import (
    ACCESS,
    NULL_HARNESS,
    TOKENIZER,
    cmdline,
    digit_share,
    run_group,
    verifiers_env_server,
)

TOOL_MODULE = b"digits_tools.tools"


def test_each_rollout_gets_a_tool_server_forked_warm_and_none_outlives_its_rollout(tmp_path: Path) -> None:
    args = {"taskset": {"num_tasks": 4}, "agent": NULL_HARNESS}
    client = {"type": "scripted", "replies": ["12 13 14", "twelve"], "tokenizer": TOKENIZER}
    with verifiers_env_server(tmp_path, args, *ACCESS, env_id="verifiers:digits-tools") as server:
        traces = run_group(server.address, 2, client) + run_group(server.address, 2, client, task_idx=1)
        (worker,) = server.workers()
        warm = [pid for pid in children(worker) if TOOL_MODULE in cmdline(pid) and b"warm_server" in cmdline(pid)]
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
