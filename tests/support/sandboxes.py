"""Test support for sandboxes: find their processes, give each test a private run directory."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from envrl.sandbox import reaper
from envrl.sandbox.bubblewrap import UID_BASE, UID_RANGE


def processes_of(uid: int | range) -> list[int]:
    """Pids of live (not zombie) processes running as host user `uid` (a sandbox's own uid), or
    as any uid in a range."""
    uids = range(uid, uid + 1) if isinstance(uid, int) else uid
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) in uids and fields["State"].split()[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


ALL_SANDBOXES = range(UID_BASE, UID_BASE + UID_RANGE)
"""Every sandbox's host uid."""


def wait_gone(uid: int | range, timeout: float = 10.0) -> list[int]:
    """The processes of `uid` still alive after waiting up to `timeout` s for them to go ([] when none)."""
    deadline = time.monotonic() + timeout
    while (left := processes_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private sandbox run directory for this test (records of its sandboxes only)."""
    path = tmp_path / "sandbox-run"
    path.mkdir(mode=0o700)
    monkeypatch.setenv(reaper.RUN_DIR_ENV, str(path))
    return path


def host_temp_dir(tmp_path: Path) -> Path:
    """A directory an unprivileged user can reach (pytest's tmp_path is under a 0700 dir), outside
    /tmp (the sandbox's own /tmp is its workdir)."""
    path = Path(f"/var/tmp/envrl-sandbox-test-{os.getpid()}-{tmp_path.name}")
    path.mkdir(mode=0o755, exist_ok=True)
    path.chmod(0o755)
    return path
