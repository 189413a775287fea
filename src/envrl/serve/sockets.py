"""The env server's two sockets: `bind` gives both or leaves nothing open, `close` releases everything once; a full
client queue raises instead of dropping; oversized frames are refused; with `curve` only known keys are admitted."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth

from envrl.serve.config import CurveServerConfig, EnvServerConfig, load_secret_certificate


@dataclass(eq=False)
class ServerSockets:
    clients: zmq.Socket[bytes]
    """The ROUTER clients connect to."""
    address: str
    """Where `clients` is bound (a port 0 resolved)."""
    workers: zmq.Socket[bytes]
    """The ROUTER the server's worker processes connect to."""
    workers_address: str
    authenticator: Any
    """The CURVE authenticator thread, or None."""
    tmpdir: str
    """Holds the workers' ipc socket."""

    @classmethod
    def bind(cls, context: zmq.Context[zmq.Socket[bytes]], config: EnvServerConfig) -> ServerSockets:
        """Bind both sockets; raises zmq.ZMQError (a taken port: errno EADDRINUSE) or ValueError (bad CURVE keys)."""
        tmpdir = tempfile.mkdtemp(prefix="envrl-env-server-")
        try:
            clients, address, authenticator = bind_clients(context, config)
        except BaseException:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        try:
            workers, workers_address = bind_workers(context, tmpdir)
        except BaseException:
            clients.close()
            if authenticator is not None:
                authenticator.stop()
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        return cls(clients, address, workers, workers_address, authenticator, tmpdir)

    def close(self) -> None:
        self.clients.close()
        self.workers.close()
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None
        shutil.rmtree(self.tmpdir, ignore_errors=True)


RECEIVE_QUEUE_FRAMES = 128
"""Received frames one client connection may have queued in the server (ZMQ's RCVHWM)."""


def bind_clients(
    context: zmq.Context[zmq.Socket[bytes]], config: EnvServerConfig
) -> tuple[zmq.Socket[bytes], str, Any]:
    """(socket, bound address, CURVE authenticator thread or None); raises zmq.ZMQError or ValueError."""
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.SNDHWM, config.client_send_queue)
    sock.setsockopt(zmq.MAXMSGSIZE, 2 * config.max_frame_bytes)
    # Frames a connection may have waiting before ZMQ stops reading from it (back-pressure, not
    # loss): with MAXMSGSIZE it bounds the bytes one client can park in the server.
    sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE_FRAMES)
    sock.setsockopt(zmq.LINGER, 1000)
    authenticator = None
    try:
        if config.curve is not None:
            authenticator = _enable_curve(context, sock, config.curve)
        address = config.address
        if address.startswith("tcp://") and address.endswith(":0"):
            address = address[:-2] + ":*"
        sock.bind(address)
    except BaseException:
        sock.close()
        if authenticator is not None:
            authenticator.stop()
        raise
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT), authenticator


def bind_workers(context: zmq.Context[zmq.Socket[bytes]], directory: str) -> tuple[zmq.Socket[bytes], str]:
    """The socket workers connect to (ipc in `directory`), unbounded both ways: the server bounds the load."""
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    address = f"ipc://{directory}/workers"
    sock.bind(address)
    return sock, address


def _enable_curve(context: zmq.Context[zmq.Socket[bytes]], sock: zmq.Socket[bytes], curve: CurveServerConfig) -> Any:
    if not curve.client_keys_dir.is_dir():
        raise ValueError(f"curve.client_keys_dir {curve.client_keys_dir} is not a directory of client public keys")
    public, secret = load_secret_certificate(curve.secret_key_file, "curve.secret_key_file")
    from zmq.auth.thread import ThreadAuthenticator

    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain="*", location=str(curve.client_keys_dir))
    sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
    return authenticator
