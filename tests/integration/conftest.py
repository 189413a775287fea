"""Fixtures of the integration tests that several test modules share."""

from __future__ import annotations

import pytest

from tests.support.smoke import FinishedRun, run_smoke


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """One 40-step `rl` smoke run per session: its console, exit code and output dir."""
    return run_smoke(tmp_path_factory.mktemp("smoke") / "smoke")
