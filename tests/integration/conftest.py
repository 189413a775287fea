"""Fixtures of the integration tests that several test modules share."""

from __future__ import annotations

import os
from functools import partial

import pytest

from envrl.runtime.secrets import API_KEY_ENV, RELOAD_TOKEN_ENV
from tests.support.secrets_probe import SECRET, SECRET_VALUE, probe
from tests.support.smoke import FinishedRun, run_smoke


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """One 40-step `rl` smoke run per session: its console, exit code and output dir. It runs with
    a secret in `rl`'s environment and neither a reload token nor an API key of the caller's (rl
    makes its own), and its `seen` is what a caller without them got while it ran
    (`secrets_probe.probe`, asserted in test_secure_defaults.py)."""
    environ = {k: v for k, v in os.environ.items() if k not in (RELOAD_TOKEN_ENV, API_KEY_ENV)} | {SECRET: SECRET_VALUE}
    out = tmp_path_factory.mktemp("smoke") / "smoke"
    return run_smoke(out, environ=environ, while_running=partial(probe, api_key_env=API_KEY_ENV))
