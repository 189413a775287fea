"""`ServerSockets`: both sockets bound or none, and `close` releasing everything, once, however often called."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from envrl.serve.config import EnvServerConfig, EnvSpec
from envrl.serve.sockets import ServerSockets


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def config(address: str = "tcp://127.0.0.1:0") -> EnvServerConfig:
    return EnvServerConfig(env=EnvSpec(id="reverse-text"), address=address)


def test_port_0_binds_a_free_port_and_close_releases_the_sockets_and_ipc_directory_twice_over(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    sockets = ServerSockets.bind(context, config())
    assert sockets.address.startswith("tcp://127.0.0.1:") and not sockets.address.endswith(":0")
    assert os.path.isdir(sockets.tmpdir) and sockets.workers_address == f"ipc://{sockets.tmpdir}/workers"
    sockets.close()
    sockets.close()
    assert not os.path.exists(sockets.tmpdir) and sockets.clients.closed and sockets.workers.closed


def test_a_taken_port_raises_eaddrinuse_and_leaves_no_ipc_directory_behind(
    context: zmq.Context[zmq.Socket[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = ServerSockets.bind(context, config())
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the second bind makes its ipc directory
        with pytest.raises(zmq.ZMQError) as raised:
            ServerSockets.bind(context, config(first.address))
        assert raised.value.errno == zmq.EADDRINUSE
        assert list(tmp_path.iterdir()) == []
    finally:
        first.close()
