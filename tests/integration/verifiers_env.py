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

from envrl.process import spawn_sidecar
from tests.integration.env_servers import RunningServer, kill_worker

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deps" / "envs" / "verifiers-digits"
ENV_ID = "verifiers:digits-count"
NULL_HARNESS = {"harness": {"id": "null"}}


@cache
def example_python() -> str:
    """The example project's interpreter, after `uv sync --locked` (about a second when up to date)."""
    subprocess.run(["uv", "sync", "--project", str(EXAMPLE), "--locked", "--quiet"], check=True, timeout=600)
    return str(EXAMPLE / ".venv" / "bin" / "python")


@contextmanager
def verifiers_env_server(tmp: Path, env_args: dict[str, Any], *args: str) -> Iterator[RunningServer]:
    log = tmp / "env-server.log"
    argv = [example_python(), "-m", "envrl.serve.main", "--env.id", ENV_ID, "--env.args", json.dumps(env_args)]
    argv += ["--address", "tcp://127.0.0.1:0", "--log-file", str(log), *args]
    child, address = spawn_sidecar(argv, name="env-server", log_file=tmp / "env-server.out", ready_timeout=120.0)
    server = RunningServer(child, address, log)
    try:
        yield server
    finally:
        server.workers()
        child.stop(grace=15.0)
        for pid in server.seen_workers:
            kill_worker(pid)
