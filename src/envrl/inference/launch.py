"""Starting an inference server and waiting for it: `start` (spawn, then `wait_until_serving`) returns
only a server that answers /health on its own port, and `wait_until_serving` refuses one another
local user listens behind; this module imports no torch, so `rl` reads it at no cost."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from loguru import logger

from envrl.inference.config import InferenceConfig
from envrl.runtime.http import poll_delays
from envrl.runtime.listeners import foreign_listeners_at, squatter_error
from envrl.runtime.process import Child, config_argv, spawn


def spawn_server(config: InferenceConfig, *, log_file: Path) -> Child:
    """Spawn `inference` for `config` (stdout and stderr to `log_file`); see `wait_until_serving`."""
    return spawn(
        [sys.executable, "-m", "envrl.inference.main", *config_argv(config)], name="inference", log_file=log_file
    )


def wait_until_serving(
    child: Child, base_url: str, timeout: float, also_check: Callable[[], None] = lambda: None
) -> None:
    """Return once `base_url/health` answers; raise ChildFailed if the server dies or times out, or
    if a socket of another uid listens where `base_url` is served on this machine (`listeners.py`:
    a server another local user started on the port while this one loads is never taken for it).

    Polls soon after the spawn, then less often (`poll_delays`), all on one HTTP client (a new
    one per poll would build an SSL context each time): death is noticed at the next poll (within
    half a second, or the 5 s timeout of a `/health` call that hangs) and named with the tail of
    the child's log;
    `also_check` runs at every poll too (a launcher checks its other children there). Progress is
    logged.
    """
    started = time.monotonic()
    next_report = started + 15.0
    delays = poll_delays()
    with httpx.Client(timeout=5.0, trust_env=False) as http:  # the run's own server: never a proxy
        while True:
            if child.poll() is not None:
                raise child.failure(f"{child.describe_exit()} before serving {base_url}")
            also_check()
            now = time.monotonic()
            if now - started > timeout:
                raise child.failure(f"did not serve {base_url}/health within {timeout:g} s")
            _refuse_foreign(child, base_url)
            try:
                answered = http.get(f"{base_url}/health").status_code == 200
            except httpx.HTTPError:
                answered = False
            if answered:
                _refuse_foreign(child, base_url)  # it may have begun to listen since
                logger.info(f"inference server ready at {base_url} after {now - started:.1f} s")
                return
            if now >= next_report:
                logger.info(f"waiting for the inference server at {base_url} ({now - started:.0f} s)")
                next_report = now + 15.0
            time.sleep(next(delays))


def _refuse_foreign(child: Child, base_url: str) -> None:
    if foreign := foreign_listeners_at(base_url):
        raise child.failure(squatter_error(base_url, foreign))


def start(config: InferenceConfig, *, log_file: Path, ready_timeout: float) -> Child:
    """Spawn `inference` for `config` and return once it serves; on failure stop it and raise."""
    child = spawn_server(config, log_file=log_file)
    try:
        wait_until_serving(child, config.base_url, ready_timeout)
    except BaseException:
        child.stop(grace=10.0)
        raise
    return child
