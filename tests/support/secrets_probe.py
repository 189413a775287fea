"""What a local caller without the run's secrets gets from a running `rl` run, and what its
processes hold in their environment: read once from the session's smoke run while it runs
(tests/integration/conftest.py), asserted in tests/integration/test_secure_defaults.py.

Guarantee: `probe` never raises; what it could not read is absent (a run that never served has
`port` None and no answers), so the smoke run's own checks, not the probe, report such a run.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.chaos_runs import marked_pids

SECRET = "ENVRL_TEST_CLOUD_KEY"
"""A secret in `rl`'s environment that no env server may see."""
SECRET_VALUE = "do-not-leak"


@dataclass
class Probe:
    port: int | None = None
    """The run's inference port, once it answered /health."""
    answers: dict[str, int] = field(default_factory=dict)
    """HTTP status of each request (its name: method, route and credential)."""
    environs: list[dict[str, str]] = field(default_factory=list)
    """The environment of each process of the run (its command line under "__cmdline__")."""


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return {}
    entries = dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)
    return {"__cmdline__": cmdline.replace(b"\0", b" ").decode(errors="replace")} | {
        k.decode(errors="replace"): v.decode(errors="replace") for k, v in entries.items()
    }


def status(port: int, path: str, headers: dict[str, str], body: dict | None = None) -> int:
    """The HTTP status of GET `path` (POST of `body` as JSON when given); -1 if nothing answered."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return -1


def wait_until_serving(proc: subprocess.Popen[bytes], timeout: float = 900) -> int | None:
    """The port of the run's inference server once it answers /health; None if the run ended or
    `timeout` passed first."""
    port = int(proc.args[proc.args.index("--inference.port") + 1])  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    while status(port, "/health", {}) != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.2)
    return port


def probe(proc: subprocess.Popen[bytes], marker: str, api_key_env: str) -> Probe:
    """Once the run serves: `/update_weights` without the run's token and with a guessed one,
    `/v1/models` without its API key and with the key the inference server holds; then the
    environment of every process of the run."""
    seen = Probe(port=wait_until_serving(proc))
    if seen.port is None:
        return seen
    update = {"path": "/nonexistent", "step": 10_000}
    seen.answers["update, no token"] = status(seen.port, "/update_weights", {}, update)
    seen.answers["update, guessed token"] = status(
        seen.port, "/update_weights", {"Authorization": "Bearer guessed"}, update
    )
    seen.answers["models, no key"] = status(seen.port, "/v1/models", {})
    seen.environs = [e for e in map(environ_of, marked_pids(marker)) if e]
    keys = [e[api_key_env] for e in seen.environs if "envrl.inference.main" in e["__cmdline__"] and api_key_env in e]
    if keys:
        seen.answers["models, the run's key"] = status(seen.port, "/v1/models", {"Authorization": f"Bearer {keys[0]}"})
    return seen
