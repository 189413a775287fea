"""The CURVE keys of planned env servers and their one client: made once by whoever starts the servers, in a directory
only its owner can enter (secrets 0600); another user's key directory is refused, key material never logged."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import zmq.auth

from envrl.data import layout
from envrl.serve.config import CurveClientConfig, CurveServerConfig


def curve_keys(curve_dir: Path) -> tuple[CurveServerConfig, CurveClientConfig]:
    """The env servers' and their client's CURVE key files in `curve_dir` (`make_curve_keys`)."""
    server = CurveServerConfig(secret_key_file=curve_dir / "server.key_secret", client_keys_dir=curve_dir / "clients")
    client = CurveClientConfig(
        server_public_key_file=curve_dir / "server.key",
        secret_key_file=curve_dir / "clients" / "orchestrator.key_secret",
    )
    return server, client


def sidecar_keys(output_dir: Path) -> tuple[CurveServerConfig, CurveClientConfig]:
    """The keys of the servers a standalone orchestrator or `rl eval` spawns (`Sidecars` makes them)
    and of their client: `<output_dir>/curve/`, as `rl`'s."""
    return curve_keys(layout.curve_dir(output_dir))


def make_curve_keys(curve_dir: Path) -> None:
    """Create the key files `curve_keys` names, secrets readable by their owner only (kept if there);
    a `PermissionError` naming the directory if it, or its `clients`, is another user's or open to others."""
    server, client = curve_keys(curve_dir)
    # Owner-only directories first: zmq writes each secret before the chmod below can narrow it.
    curve_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (curve_dir / "clients").mkdir(exist_ok=True, mode=0o700)
    for directory in (curve_dir, curve_dir / "clients"):
        _check_private(directory)
    if server.secret_key_file.is_file() and client.secret_key_file.is_file():
        return
    zmq.auth.create_certificates(curve_dir, "server")
    zmq.auth.create_certificates(curve_dir / "clients", "orchestrator")
    for secret in (server.secret_key_file, client.secret_key_file):
        os.chmod(secret, 0o600)


def _check_private(directory: Path) -> None:
    """Refuse a key directory that is not ours alone: its keys may have been read or planted."""
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"CURVE key directory {directory} is not private to this user (owner uid {st.st_uid}, mode "
            f"{stat.filemode(st.st_mode)}): its keys may have been read or replaced; remove it (envrl makes "
            "fresh keys there, mode 0700) or point output_dir elsewhere"
        )
