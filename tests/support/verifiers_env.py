"""The verifiers example's own venv, and env servers running in it, for the verifiers tests.

Guarantee: `example_python()` is the interpreter of deps/envs/verifiers-digits, synced from its
uv.lock (verifiers installed there, never in envrl's venv); `verifiers_env_server` yields a ready
env server of `verifiers:digits-count` running in it, serving the model client it is given, and
stops it and its workers on exit, even when the test failed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from envrl.data.traces import Trace
from envrl.envclient.client import EnvClient
from tests.support.env_servers import RunningServer, running_env_server

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[1] / "deps" / "envs" / "verifiers-digits"
ENV_ID = "verifiers:digits-count"
NULL_HARNESS = {"harness": {"id": "null"}}
TOKENIZER = str(HERE.parents[1] / "deps" / "models" / "tiny-chat")
TIMEOUT = 300.0
ONE_WORKER = ("--pool", '{"min_workers": 1, "max_workers": 1}')
"""Importing verifiers costs ~8 s of CPU per process: one worker is enough for a few rollouts."""


@cache
def example_python() -> str:
    """The example project's interpreter, after `uv sync --locked` (about a second when up to date)."""
    subprocess.run(["uv", "sync", "--project", str(EXAMPLE), "--locked", "--quiet"], check=True, timeout=600)
    return str(EXAMPLE / ".venv" / "bin" / "python")


@contextmanager
def verifiers_env_server(
    tmp: Path, env_args: dict[str, Any], *args: str, client: dict[str, Any], env_id: str = ENV_ID
) -> Iterator[RunningServer]:
    """A server of `env_id` in the example's venv (this directory importable: test tasksets live
    here), its rollouts on `client`."""
    server_args = ("--env.args", json.dumps(env_args), *ONE_WORKER, *args)
    with running_env_server(
        tmp, *server_args, env_id=env_id, client=client, ready_timeout=180.0, python=example_python()
    ) as server:
        yield server


def run_group(address: str, n: int, task_idx: int = 0, split: str = "train") -> list[Trace]:
    """`n` rollouts of one task through an env client (8 tokens a turn, seed 5) with the server's client."""

    async def main() -> list[Trace]:
        async with EnvClient(address, timeout=TIMEOUT) as env:
            return await env.run(task_idx, n=n, sampling={"max_tokens": 8}, split=split, seed=5)  # type: ignore[arg-type]

    return asyncio.run(main())


def digit_share(text: str) -> float:
    """digits-count's reward of a reply."""
    chars = [c for c in text if not c.isspace()]
    return sum(c in "0123456789" for c in chars) / len(chars) if chars else 0.0
