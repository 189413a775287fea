"""Where a sandbox keeps its state when its usual directory was planted, and which host uids it
may take (a real probe process, real NSS, subid files as the kernel tools write them)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from envrl.sandbox import SandboxConfig, SandboxStartError, reaper, uids
from envrl.sandbox.user_dirs import owned_dir

NOBODY = 65534


def test_a_directory_planted_by_another_user_is_refused_for_a_private_one(tmp_path: Path) -> None:
    planted = tmp_path / "envrl-sandbox-venvs-0"
    planted.mkdir(mode=0o777)
    os.chown(planted, NOBODY, NOBODY)
    got = owned_dir(planted, 0o755, refuse=0o022, what="sandbox venv directory", fix="remove it")
    assert got != planted and got.parent == tmp_path and got.name.startswith("envrl-sandbox-venvs-0-")
    assert got.stat().st_uid == os.getuid() and got.stat().st_mode & 0o777 == 0o755
    assert list(planted.iterdir()) == []  # the planted one is neither used nor touched
    assert owned_dir(planted, 0o755, refuse=0o022, what="x", fix="y") == got


def test_no_safe_directory_at_all_is_a_start_error_saying_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with pytest.raises(SandboxStartError, match=r"a-file/runs cannot be created .* no private directory beside it"):
        owned_dir(blocker / "runs", 0o700, refuse=0o077, what="sandbox run directory", fix="set TMPDIR")


def test_uids_known_to_nss_or_delegated_in_subid_files_are_never_taken(tmp_path: Path) -> None:
    subuid = tmp_path / "subuid"
    subuid.write_text("alice:1999200000:65536\nbroken line\nbob:x:1\n")
    delegated = uids.subid_ranges([subuid, tmp_path / "absent"])
    assert delegated == [range(1_999_200_000, 1_999_265_536)]
    assert uids.known(0, delegated) == "NSS user 'root'"
    assert "NSS" in str(uids.known(NOBODY, delegated))
    assert uids.known(1_999_200_001, delegated) == "in the subordinate id range 1999200000-1999265535"
    assert uids.known(1_999_300_000, delegated) is None


def test_a_uid_a_process_runs_as_is_skipped_and_a_range_with_none_free_is_a_start_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(reaper.RUN_DIR_ENV, str(tmp_path / "run"))
    busy = 1_999_100_000
    sleeper = subprocess.Popen(["setpriv", f"--reuid={busy}", f"--regid={busy}", "--clear-groups", "sleep", "600"])
    try:
        deadline = time.monotonic() + 10  # until setpriv has become the uid
        while not uids.has_processes(busy):
            assert time.monotonic() < deadline, "the probe does not see the sleeper"
        assert not uids.has_processes(busy + 1)
        for _ in range(4):  # whichever uid the walk starts at, the busy one is passed over
            record = uids.claim_free(busy, busy + 2)
            assert record.uid == busy + 1
            reaper.release(record)
        with pytest.raises(SandboxStartError, match=rf"no free sandbox uid .*{busy}: processes run as it"):
            uids.claim_free(busy, busy + 1)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_uid_range_is_validated() -> None:
    assert SandboxConfig(host_uids=(2_000_000, 3_000_000)).host_uids == (2_000_000, 3_000_000)
    for bad in ((0, 10), (10, 10), (5, 2**32)):
        with pytest.raises(ValidationError, match="sandbox.host_uids must be"):
            SandboxConfig(host_uids=bad)
