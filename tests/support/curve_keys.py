"""CURVE key pairs for env-server tests: the server's, an admitted client's and a stranger's.

Guarantee: secret key files are mode 0600, as docs/protocol.md makes them, so the server accepts them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq.auth

from envrl.serve.config import CurveClientConfig


@dataclass
class CurveKeys:
    server: str
    """The server's `--curve` option: its secret key and the directory of admitted client keys."""
    client: CurveClientConfig
    """An admitted client's keys."""
    stranger: CurveClientConfig
    """Keys of a client the server does not list."""


def make_curve_keys(tmp_path: Path) -> CurveKeys:
    keys, allowed, strangers = tmp_path / "keys", tmp_path / "allowed", tmp_path / "strangers"
    for folder in (keys, allowed, strangers):
        folder.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(keys, "server")
    _, client_secret = zmq.auth.create_certificates(allowed, "client")
    _, stranger_secret = zmq.auth.create_certificates(strangers, "stranger")
    for secret in (server_secret, client_secret, stranger_secret):
        os.chmod(secret, 0o600)  # as docs/protocol.md makes them (umask 077)
    return CurveKeys(
        server=f'{{"secret_key_file": "{server_secret}", "client_keys_dir": "{allowed}"}}',
        client=CurveClientConfig(server_public_key_file=Path(server_public), secret_key_file=Path(client_secret)),
        stranger=CurveClientConfig(server_public_key_file=Path(server_public), secret_key_file=Path(stranger_secret)),
    )
