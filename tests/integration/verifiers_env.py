"""The verifiers example's own venv, and env servers running in it, for the verifiers tests.

Guarantee: `example_python()` is the interpreter of deps/envs/verifiers-digits, synced from its
uv.lock (verifiers installed there, never in envrl's venv); `verifiers_env_server` yields a ready
env server of `verifiers:digits-count` running in it and stops it and its workers on exit, even
when the test failed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from envrl.process import spawn_sidecar
from tests.integration.env_servers import RunningServer, kill_worker

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
    log = tmp / "env-server.log"
    argv = [example_python(), "-m", "envrl.serve.main", "--env.id", env_id, "--env.args", json.dumps(env_args)]
    argv += ["--address", "tcp://127.0.0.1:0", "--log-file", str(log), *ONE_WORKER, *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    child, address = spawn_sidecar(
        argv, name="env-server", log_file=tmp / "env-server.out", env=env, ready_timeout=180.0
    )
    server = RunningServer(child, address, log)
    try:
        yield server
    finally:
        server.workers()
        child.stop(grace=15.0)
        for pid in server.seen_workers:
            kill_worker(pid)
