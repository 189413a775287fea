"""The verifiers example's own venv, and env servers running in it, for the verifiers tests.

Guarantee: `example_python()` is the interpreter of deps/envs/verifiers-digits, synced from its
uv.lock (verifiers installed there, never in envrl's venv); `verifiers_env_server` yields a ready
env server of `verifiers:digits-count` running in it and stops it and its workers on exit, even
when the test failed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from tests.integration.env_servers import RunningServer, running_env_server

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[1] / "deps" / "envs" / "verifiers-digits"
ENV_ID = "verifiers:digits-count"
NULL_HARNESS = {"harness": {"id": "null"}}
ONE_WORKER = ("--pool", '{"type": "static", "num_workers": 1}')
"""Importing verifiers costs ~8 s of CPU per process: one worker is enough for a few rollouts."""


@cache
def example_python() -> str:
    """The example project's interpreter, after `uv sync --locked` (about a second when up to date)."""
    subprocess.run(["uv", "sync", "--project", str(EXAMPLE), "--locked", "--quiet"], check=True, timeout=600)
    return str(EXAMPLE / ".venv" / "bin" / "python")


@contextmanager
def verifiers_env_server(
    tmp: Path, env_args: dict[str, Any], *args: str, env_id: str = ENV_ID
) -> Iterator[RunningServer]:
    """A server of `env_id` in the example's venv (this directory importable: test tasksets live here)."""
    server_args = ("--env.args", json.dumps(env_args), *ONE_WORKER, *args)
    with running_env_server(tmp, *server_args, env_id=env_id, ready_timeout=180.0, python=example_python()) as server:
        yield server
