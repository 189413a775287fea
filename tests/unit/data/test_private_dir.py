"""A run's output directory: made private when envrl makes it, refused when another user owns it."""

import os
import pwd
import stat
from pathlib import Path

import pytest

from envrl.config import ConfigError
from envrl.data.private_dir import own_output_dir
from tests.support.other_user import needs_root


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_directory_envrl_makes_is_nobody_elses_to_read(tmp_path: Path) -> None:
    """Before: `rl eval` and a standalone orchestrator made theirs with the umask (0755 here)."""
    out = tmp_path / "runs" / "eval"
    own_output_dir(out)
    assert out.is_dir() and mode(out) == 0o700


def test_a_directory_that_exists_keeps_the_mode_its_owner_gave_it(tmp_path: Path) -> None:
    out = tmp_path / "shared-with-my-group"
    out.mkdir(mode=0o750)
    out.chmod(0o750)
    own_output_dir(out)
    assert mode(out) == 0o750


def test_a_file_or_another_users_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        own_output_dir(tmp_path / "file")
    needs_root()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)  # planted by another user
    with pytest.raises(ConfigError, match=r"belongs to uid \d+, not to this user"):
        own_output_dir(theirs)
