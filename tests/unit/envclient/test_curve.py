"""The CURVE keys of spawned env servers: made private to their owner, kept across a resume, and
never taken from a directory another user owns or can enter (its keys may have been read or planted)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from envrl.envclient.curve import curve_keys, make_curve_keys


def test_keys_are_made_private_and_kept_when_made_again(tmp_path: Path) -> None:
    keys = tmp_path / "curve"
    make_curve_keys(keys)
    server, client = curve_keys(keys)
    for directory in (keys, keys / "clients"):
        assert directory.stat().st_mode & 0o777 == 0o700, oct(directory.stat().st_mode)
    for secret in (server.secret_key_file, client.secret_key_file):
        assert secret.stat().st_mode & 0o777 == 0o600, oct(secret.stat().st_mode)
    before = [path.read_bytes() for path in (server.secret_key_file, client.secret_key_file)]
    make_curve_keys(keys)  # a resumed run, a restarted eval: the same keys
    assert [path.read_bytes() for path in (server.secret_key_file, client.secret_key_file)] == before


@pytest.mark.parametrize("opened", ["curve", "curve/clients"])
def test_a_key_directory_other_users_can_enter_is_refused(tmp_path: Path, opened: str) -> None:
    keys = tmp_path / "curve"
    (keys / "clients").mkdir(parents=True, mode=0o700)
    keys.chmod(0o700)
    (tmp_path / opened).chmod(0o755)
    with pytest.raises(PermissionError, match=rf"CURVE key directory {tmp_path / opened} is not private .*drwxr-xr-x"):
        make_curve_keys(keys)
    assert not curve_keys(keys)[0].secret_key_file.exists()


def test_a_key_directory_another_user_owns_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    keys = tmp_path / "curve"
    keys.mkdir(mode=0o700)
    os.chown(keys, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(PermissionError, match=r"not private to this user \(owner uid \d+"):
        make_curve_keys(keys)
