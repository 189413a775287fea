"""Where a sandbox keeps its state when its usual directory was planted, and which host uids it
may take (a real probe process, real NSS, subid files as the kernel tools write them)."""

from __future__ import annotations

import os
import tempfile
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


def test_a_claim_passes_over_uids_refused_before_and_says_why_when_none_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(reaper.RUN_DIR_ENV, str(tmp_path / "run"))
    first = 1_999_100_000
    for _ in range(4):  # whichever uid the walk starts at, the refused one is passed over
        record = uids.claim_free(first, first + 2, {first: "processes run as it"})
        assert record.uid == first + 1
        reaper.release(record)
    held = uids.claim_free(first + 1, first + 2, {})
    refused = {first: "processes run as it"}
    with pytest.raises(SandboxStartError, match=rf"no free sandbox uid .*{first + 1}: claimed by a live sandbox"):
        uids.claim_free(first, first + 2, refused)
    reaper.release(held)
    with pytest.raises(SandboxStartError, match=r"65534: NSS user"):
        uids.claim_free(NOBODY, NOBODY + 1, {})


def test_the_uid_range_is_validated() -> None:
    assert SandboxConfig(host_uids=(2_000_000, 3_000_000)).host_uids == (2_000_000, 3_000_000)
    for bad in ((0, 10), (10, 10), (5, 2**32)):
        with pytest.raises(ValidationError, match="sandbox.host_uids must be"):
            SandboxConfig(host_uids=bad)
